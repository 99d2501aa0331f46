"""gRPC servicers: translate protobuf <-> application inputs/outputs and call ``SchedulerApp``.

Servicers validate every request (``validation``), convert (``convert``), and map typed errors to
gRPC statuses (``status``). They hold no state and make no decisions.
"""
