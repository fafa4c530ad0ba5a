from chorus.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "negative_prompt", "duration_s", "start_s", "num_steps", "guidance_scale", "seed", "num_outputs", "sample_format")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    negative_prompt: str
    duration_s: float
    start_s: float
    num_steps: int
    guidance_scale: float
    seed: int
    num_outputs: int
    sample_format: _common_pb2.SampleFormat
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., duration_s: _Optional[float] = ..., start_s: _Optional[float] = ..., num_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., num_outputs: _Optional[int] = ..., sample_format: _Optional[_Union[_common_pb2.SampleFormat, str]] = ...) -> None: ...

class Audio(_message.Message):
    __slots__ = ("index", "pcm")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    index: int
    pcm: _common_pb2.PcmChunk
    def __init__(self, index: _Optional[int] = ..., pcm: _Optional[_Union[_common_pb2.PcmChunk, _Mapping]] = ...) -> None: ...

class GenerateOutput(_message.Message):
    __slots__ = ("progress", "audio", "final")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    progress: _common_pb2.Progress
    audio: Audio
    final: _common_pb2.Final
    def __init__(self, progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., audio: _Optional[_Union[Audio, _Mapping]] = ..., final: _Optional[_Union[_common_pb2.Final, _Mapping]] = ...) -> None: ...
