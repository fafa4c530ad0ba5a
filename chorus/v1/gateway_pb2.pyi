from chorus.v1 import common_pb2 as _common_pb2
from chorus.v1 import talker_pb2 as _talker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_FORMAT_UNSPECIFIED: _ClassVar[AudioFormat]
    AUDIO_FORMAT_MP3: _ClassVar[AudioFormat]
    AUDIO_FORMAT_OPUS: _ClassVar[AudioFormat]
    AUDIO_FORMAT_AAC: _ClassVar[AudioFormat]
    AUDIO_FORMAT_FLAC: _ClassVar[AudioFormat]
    AUDIO_FORMAT_WAV: _ClassVar[AudioFormat]
    AUDIO_FORMAT_PCM: _ClassVar[AudioFormat]

class RequestState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATE_UNSPECIFIED: _ClassVar[RequestState]
    REQUEST_STATE_QUEUED: _ClassVar[RequestState]
    REQUEST_STATE_RUNNING: _ClassVar[RequestState]
    REQUEST_STATE_DONE: _ClassVar[RequestState]
    REQUEST_STATE_FAILED: _ClassVar[RequestState]
    REQUEST_STATE_CANCELLED: _ClassVar[RequestState]
AUDIO_FORMAT_UNSPECIFIED: AudioFormat
AUDIO_FORMAT_MP3: AudioFormat
AUDIO_FORMAT_OPUS: AudioFormat
AUDIO_FORMAT_AAC: AudioFormat
AUDIO_FORMAT_FLAC: AudioFormat
AUDIO_FORMAT_WAV: AudioFormat
AUDIO_FORMAT_PCM: AudioFormat
REQUEST_STATE_UNSPECIFIED: RequestState
REQUEST_STATE_QUEUED: RequestState
REQUEST_STATE_RUNNING: RequestState
REQUEST_STATE_DONE: RequestState
REQUEST_STATE_FAILED: RequestState
REQUEST_STATE_CANCELLED: RequestState

class SpeakRequest(_message.Message):
    __slots__ = ("model", "input", "voice", "instructions", "response_format", "speed", "language", "task_type", "ref_audio", "ref_text", "x_vector_only", "sampling", "seed", "max_frames", "idempotency_key", "ignore_eos", "speaker_embedding")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    REF_AUDIO_FIELD_NUMBER: _ClassVar[int]
    REF_TEXT_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_ONLY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    model: str
    input: str
    voice: str
    instructions: str
    response_format: AudioFormat
    speed: float
    language: str
    task_type: _talker_pb2.TaskType
    ref_audio: bytes
    ref_text: str
    x_vector_only: bool
    sampling: _talker_pb2.SamplingParams
    seed: int
    max_frames: int
    idempotency_key: str
    ignore_eos: bool
    speaker_embedding: bytes
    def __init__(self, model: _Optional[str] = ..., input: _Optional[str] = ..., voice: _Optional[str] = ..., instructions: _Optional[str] = ..., response_format: _Optional[_Union[AudioFormat, str]] = ..., speed: _Optional[float] = ..., language: _Optional[str] = ..., task_type: _Optional[_Union[_talker_pb2.TaskType, str]] = ..., ref_audio: _Optional[bytes] = ..., ref_text: _Optional[str] = ..., x_vector_only: bool = ..., sampling: _Optional[_Union[_talker_pb2.SamplingParams, _Mapping]] = ..., seed: _Optional[int] = ..., max_frames: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., ignore_eos: bool = ..., speaker_embedding: _Optional[bytes] = ...) -> None: ...

class SpeakInput(_message.Message):
    __slots__ = ("request", "text_delta", "end_of_input")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    request: SpeakRequest
    text_delta: str
    end_of_input: bool
    def __init__(self, request: _Optional[_Union[SpeakRequest, _Mapping]] = ..., text_delta: _Optional[str] = ..., end_of_input: bool = ...) -> None: ...

class AudioData(_message.Message):
    __slots__ = ("data", "sequence")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sequence: int
    def __init__(self, data: _Optional[bytes] = ..., sequence: _Optional[int] = ...) -> None: ...

class SpeakOutput(_message.Message):
    __slots__ = ("request_id", "audio", "final")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    audio: AudioData
    final: _common_pb2.Final
    def __init__(self, request_id: _Optional[str] = ..., audio: _Optional[_Union[AudioData, _Mapping]] = ..., final: _Optional[_Union[_common_pb2.Final, _Mapping]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("request_id", "after_sequence")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    after_sequence: int
    def __init__(self, request_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class TextToAudioRequest(_message.Message):
    __slots__ = ("model", "prompt", "negative_prompt", "duration_s", "num_steps", "guidance_scale", "seed", "response_format", "idempotency_key")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    negative_prompt: str
    duration_s: float
    num_steps: int
    guidance_scale: float
    seed: int
    response_format: AudioFormat
    idempotency_key: str
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., duration_s: _Optional[float] = ..., num_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., response_format: _Optional[_Union[AudioFormat, str]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class TextToAudioOutput(_message.Message):
    __slots__ = ("request_id", "progress", "audio", "final")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    progress: _common_pb2.Progress
    audio: AudioData
    final: _common_pb2.Final
    def __init__(self, request_id: _Optional[str] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., audio: _Optional[_Union[AudioData, _Mapping]] = ..., final: _Optional[_Union[_common_pb2.Final, _Mapping]] = ...) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RequestStatus(_message.Message):
    __slots__ = ("request_id", "kind", "state", "model", "voice", "created_at_s", "started_at_s", "finished_at_s", "usage", "error", "progress", "last_sequence")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_S_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_S_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: str
    state: RequestState
    model: str
    voice: str
    created_at_s: float
    started_at_s: float
    finished_at_s: float
    usage: _common_pb2.Usage
    error: _common_pb2.Error
    progress: _common_pb2.Progress
    last_sequence: int
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[str] = ..., state: _Optional[_Union[RequestState, str]] = ..., model: _Optional[str] = ..., voice: _Optional[str] = ..., created_at_s: _Optional[float] = ..., started_at_s: _Optional[float] = ..., finished_at_s: _Optional[float] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., last_sequence: _Optional[int] = ...) -> None: ...

class Voice(_message.Message):
    __slots__ = ("name", "model", "task_type", "id", "created_at_s", "language", "ref_text", "ref_duration_s", "x_vector_only", "instructions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_S_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    REF_TEXT_FIELD_NUMBER: _ClassVar[int]
    REF_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_ONLY_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    task_type: _talker_pb2.TaskType
    id: str
    created_at_s: float
    language: str
    ref_text: str
    ref_duration_s: float
    x_vector_only: bool
    instructions: str
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., task_type: _Optional[_Union[_talker_pb2.TaskType, str]] = ..., id: _Optional[str] = ..., created_at_s: _Optional[float] = ..., language: _Optional[str] = ..., ref_text: _Optional[str] = ..., ref_duration_s: _Optional[float] = ..., x_vector_only: bool = ..., instructions: _Optional[str] = ...) -> None: ...

class VoiceListRequest(_message.Message):
    __slots__ = ("after", "limit")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: int
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class VoiceList(_message.Message):
    __slots__ = ("voices", "languages", "has_more")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[Voice]
    languages: _containers.RepeatedScalarFieldContainer[str]
    has_more: bool
    def __init__(self, voices: _Optional[_Iterable[_Union[Voice, _Mapping]]] = ..., languages: _Optional[_Iterable[str]] = ..., has_more: bool = ...) -> None: ...

class CreateVoiceRequest(_message.Message):
    __slots__ = ("name", "audio", "ref_text", "language", "x_vector_only", "instructions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    REF_TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_ONLY_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    audio: bytes
    ref_text: str
    language: str
    x_vector_only: bool
    instructions: str
    def __init__(self, name: _Optional[str] = ..., audio: _Optional[bytes] = ..., ref_text: _Optional[str] = ..., language: _Optional[str] = ..., x_vector_only: bool = ..., instructions: _Optional[str] = ...) -> None: ...

class VoiceRef(_message.Message):
    __slots__ = ("voice",)
    VOICE_FIELD_NUMBER: _ClassVar[int]
    voice: str
    def __init__(self, voice: _Optional[str] = ...) -> None: ...
