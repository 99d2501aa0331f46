"""aryl-sim: a trace-driven simulator that runs the *same* scheduling core and cycle as the service.

Nouns:
- ``TraceJob``: one training job of a workload trace (arrival, size, work, elasticity, throughput model).
- ``DemandSeries``: inference servers needed over time, from a request-rate trace or a synthetic curve.
- The simulated cluster implements the cycle's ``ClusterState`` port in memory; a virtual clock
  replaces the wall clock; simulated agents apply desired state at once. Nothing else differs from the
  service: ``scheduler_service.cycle.SchedulingCycle`` and the registered policies are imported, never
  copied, and there is no ``if simulate`` anywhere.
"""

from simulator.blas import pin as _pin_blas

_pin_blas()  # before anything loads scipy's BLAS: the same kernels on every machine (simulator.blas)
