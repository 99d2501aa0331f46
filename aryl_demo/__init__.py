"""``aryl-demo`` (``make demo``): the whole Aryl story on one machine, with fake GPUs, in real processes.

The one place that ties Aryl's programs together: it starts the scheduler, node agents, model
servers and the router as their console scripts, drives traffic and jobs through them, and reads
the cluster with ``arylctl``. Nothing in Aryl imports it; it is not part of any daemon.
"""
