from chorus.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TYPE_UNSPECIFIED: _ClassVar[TaskType]
    TASK_TYPE_CUSTOM_VOICE: _ClassVar[TaskType]
    TASK_TYPE_VOICE_DESIGN: _ClassVar[TaskType]
    TASK_TYPE_VOICE_CLONE: _ClassVar[TaskType]
TASK_TYPE_UNSPECIFIED: TaskType
TASK_TYPE_CUSTOM_VOICE: TaskType
TASK_TYPE_VOICE_DESIGN: TaskType
TASK_TYPE_VOICE_CLONE: TaskType

class SamplingParams(_message.Message):
    __slots__ = ("greedy", "temperature", "top_k", "top_p", "repetition_penalty", "subtalker_greedy", "subtalker_temperature", "subtalker_top_k", "subtalker_top_p")
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_GREEDY_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_TOP_K_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_TOP_P_FIELD_NUMBER: _ClassVar[int]
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    subtalker_greedy: bool
    subtalker_temperature: float
    subtalker_top_k: int
    subtalker_top_p: float
    def __init__(self, greedy: bool = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., subtalker_greedy: bool = ..., subtalker_temperature: _Optional[float] = ..., subtalker_top_k: _Optional[int] = ..., subtalker_top_p: _Optional[float] = ...) -> None: ...

class VoiceClone(_message.Message):
    __slots__ = ("speaker_embedding", "reference_audio", "reference_codes", "reference_text", "x_vector_only")
    SPEAKER_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_AUDIO_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_CODES_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_TEXT_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_ONLY_FIELD_NUMBER: _ClassVar[int]
    speaker_embedding: _containers.RepeatedScalarFieldContainer[float]
    reference_audio: bytes
    reference_codes: _common_pb2.CodecChunk
    reference_text: str
    x_vector_only: bool
    def __init__(self, speaker_embedding: _Optional[_Iterable[float]] = ..., reference_audio: _Optional[bytes] = ..., reference_codes: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ..., reference_text: _Optional[str] = ..., x_vector_only: bool = ...) -> None: ...

class SynthesisRequest(_message.Message):
    __slots__ = ("request_id", "text", "task_type", "speaker", "language", "instructions", "voice_clone", "sampling", "seed", "max_frames", "chunk_frames", "streaming_text", "ignore_eos", "prefix_frames")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    VOICE_CLONE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    STREAMING_TEXT_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    task_type: TaskType
    speaker: str
    language: str
    instructions: str
    voice_clone: VoiceClone
    sampling: SamplingParams
    seed: int
    max_frames: int
    chunk_frames: int
    streaming_text: bool
    ignore_eos: bool
    prefix_frames: _common_pb2.CodecChunk
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., task_type: _Optional[_Union[TaskType, str]] = ..., speaker: _Optional[str] = ..., language: _Optional[str] = ..., instructions: _Optional[str] = ..., voice_clone: _Optional[_Union[VoiceClone, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., seed: _Optional[int] = ..., max_frames: _Optional[int] = ..., chunk_frames: _Optional[int] = ..., streaming_text: bool = ..., ignore_eos: bool = ..., prefix_frames: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ...) -> None: ...

class SynthesizeInput(_message.Message):
    __slots__ = ("request", "text_delta", "end_of_input")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    request: SynthesisRequest
    text_delta: str
    end_of_input: bool
    def __init__(self, request: _Optional[_Union[SynthesisRequest, _Mapping]] = ..., text_delta: _Optional[str] = ..., end_of_input: bool = ...) -> None: ...

class SynthesizeOutput(_message.Message):
    __slots__ = ("chunk", "final")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.CodecChunk
    final: _common_pb2.Final
    def __init__(self, chunk: _Optional[_Union[_common_pb2.CodecChunk, _Mapping]] = ..., final: _Optional[_Union[_common_pb2.Final, _Mapping]] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("model", "task_types", "speakers", "languages")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    model: str
    task_types: _containers.RepeatedScalarFieldContainer[TaskType]
    speakers: _containers.RepeatedScalarFieldContainer[str]
    languages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., task_types: _Optional[_Iterable[_Union[TaskType, str]]] = ..., speakers: _Optional[_Iterable[str]] = ..., languages: _Optional[_Iterable[str]] = ...) -> None: ...

class EmbedSpeakerRequest(_message.Message):
    __slots__ = ("audio",)
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    def __init__(self, audio: _Optional[bytes] = ...) -> None: ...

class EmbedSpeakerResponse(_message.Message):
    __slots__ = ("speaker_embedding",)
    SPEAKER_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    speaker_embedding: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, speaker_embedding: _Optional[_Iterable[float]] = ...) -> None: ...
