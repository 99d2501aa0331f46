from protos.aryl.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportDemandRequest(_message.Message):
    __slots__ = ("servers_needed", "observed_rps", "source")
    SERVERS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_RPS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    servers_needed: int
    observed_rps: float
    source: str
    def __init__(self, servers_needed: _Optional[int] = ..., observed_rps: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class ReportDemandResponse(_message.Message):
    __slots__ = ("demand", "servers_serving", "servers_loaned")
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    SERVERS_SERVING_FIELD_NUMBER: _ClassVar[int]
    SERVERS_LOANED_FIELD_NUMBER: _ClassVar[int]
    demand: _types_pb2.InferenceDemand
    servers_serving: int
    servers_loaned: int
    def __init__(self, demand: _Optional[_Union[_types_pb2.InferenceDemand, _Mapping]] = ..., servers_serving: _Optional[int] = ..., servers_loaned: _Optional[int] = ...) -> None: ...

class GetDemandRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetDemandResponse(_message.Message):
    __slots__ = ("demand",)
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    demand: _types_pb2.InferenceDemand
    def __init__(self, demand: _Optional[_Union[_types_pb2.InferenceDemand, _Mapping]] = ...) -> None: ...

class WatchServingPoolRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: str
    def __init__(self, source: _Optional[str] = ...) -> None: ...

class RoutableServer(_message.Message):
    __slots__ = ("server_id", "endpoint", "state")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    endpoint: str
    state: _types_pb2.ServerState
    def __init__(self, server_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.ServerState, str]] = ...) -> None: ...

class ServingPool(_message.Message):
    __slots__ = ("servers", "version")
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[RoutableServer]
    version: int
    def __init__(self, servers: _Optional[_Iterable[_Union[RoutableServer, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class ReportDrainedRequest(_message.Message):
    __slots__ = ("server_id", "source")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    source: str
    def __init__(self, server_id: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ReportDrainedResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _types_pb2.ServerState
    def __init__(self, state: _Optional[_Union[_types_pb2.ServerState, str]] = ...) -> None: ...
