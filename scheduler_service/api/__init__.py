"""gRPC servicers: translate protobuf <-> plain values (``records``) and call the use cases (``app``).

Servicers validate every request (``validation``), convert (``convert``), and map typed errors to
gRPC statuses (``status``). They hold no state and make no decisions.
"""
