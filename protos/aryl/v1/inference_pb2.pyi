from protos.aryl.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
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
