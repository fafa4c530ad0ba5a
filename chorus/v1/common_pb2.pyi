from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_MAX_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_COMPLETE: _ClassVar[FinishReason]

class SampleFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_FORMAT_UNSPECIFIED: _ClassVar[SampleFormat]
    SAMPLE_FORMAT_PCM_S16LE: _ClassVar[SampleFormat]
    SAMPLE_FORMAT_PCM_F32LE: _ClassVar[SampleFormat]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_MAX_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_COMPLETE: FinishReason
SAMPLE_FORMAT_UNSPECIFIED: SampleFormat
SAMPLE_FORMAT_PCM_S16LE: SampleFormat
SAMPLE_FORMAT_PCM_F32LE: SampleFormat

class Timings(_message.Message):
    __slots__ = ("queue_ms", "first_output_ms", "total_ms", "admitted_at_s", "received_at_s")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTPUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_S_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    first_output_ms: float
    total_ms: float
    admitted_at_s: float
    received_at_s: float
    def __init__(self, queue_ms: _Optional[float] = ..., first_output_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., admitted_at_s: _Optional[float] = ..., received_at_s: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "num_frames", "audio_s", "num_steps", "timings")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_S_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    num_frames: int
    audio_s: float
    num_steps: int
    timings: Timings
    def __init__(self, input_tokens: _Optional[int] = ..., num_frames: _Optional[int] = ..., audio_s: _Optional[float] = ..., num_steps: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("reason", "usage", "error")
    REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    usage: Usage
    error: Error
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class CodecChunk(_message.Message):
    __slots__ = ("codes", "num_frames", "num_codebooks", "sequence", "frame_offset")
    CODES_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    NUM_CODEBOOKS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FRAME_OFFSET_FIELD_NUMBER: _ClassVar[int]
    codes: bytes
    num_frames: int
    num_codebooks: int
    sequence: int
    frame_offset: int
    def __init__(self, codes: _Optional[bytes] = ..., num_frames: _Optional[int] = ..., num_codebooks: _Optional[int] = ..., sequence: _Optional[int] = ..., frame_offset: _Optional[int] = ...) -> None: ...

class PcmChunk(_message.Message):
    __slots__ = ("data", "sample_rate_hz", "num_channels", "format", "sequence", "sample_offset")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    NUM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sample_rate_hz: int
    num_channels: int
    format: SampleFormat
    sequence: int
    sample_offset: int
    def __init__(self, data: _Optional[bytes] = ..., sample_rate_hz: _Optional[int] = ..., num_channels: _Optional[int] = ..., format: _Optional[_Union[SampleFormat, str]] = ..., sequence: _Optional[int] = ..., sample_offset: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "num_steps")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    step: int
    num_steps: int
    def __init__(self, step: _Optional[int] = ..., num_steps: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("live_streams", "free_slots", "queue_depth", "is_draining")
    LIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    IS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    live_streams: int
    free_slots: int
    queue_depth: int
    is_draining: bool
    def __init__(self, live_streams: _Optional[int] = ..., free_slots: _Optional[int] = ..., queue_depth: _Optional[int] = ..., is_draining: bool = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
