from chorus.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodeOpen(_message.Message):
    __slots__ = ("request_id", "format", "context_codes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_CODES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    format: _common_pb2.SampleFormat
    context_codes: _common_pb2.CodecChunk
    def __init__(self, request_id: _Optional[str] = ..., format: _Optional[_Union[_common_pb2.SampleFormat, str]] = ..., context_codes: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ...) -> None: ...

class DecodeInput(_message.Message):
    __slots__ = ("open", "chunk", "end_of_input")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    open: DecodeOpen
    chunk: _common_pb2.CodecChunk
    end_of_input: bool
    def __init__(self, open: _Optional[_Union[DecodeOpen, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ..., end_of_input: bool = ...) -> None: ...

class DecodeOutput(_message.Message):
    __slots__ = ("pcm", "final")
    PCM_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    pcm: _common_pb2.PcmChunk
    final: _common_pb2.Final
    def __init__(self, pcm: _Optional[_Union[_common_pb2.PcmChunk, _Mapping]] = ..., final: _Optional[_Union[_common_pb2.Final, _Mapping]] = ...) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("request_id", "audio")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    audio: bytes
    def __init__(self, request_id: _Optional[str] = ..., audio: _Optional[bytes] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("codes", "audio_s")
    CODES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_S_FIELD_NUMBER: _ClassVar[int]
    codes: _common_pb2.CodecChunk
    audio_s: float
    def __init__(self, codes: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ..., audio_s: _Optional[float] = ...) -> None: ...
