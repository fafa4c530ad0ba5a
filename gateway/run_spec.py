"""What a run needs to start again in any gateway process, as the bytes its run-queue entry carries.

A speech run: its segments' SynthesisRequests (each with the seed the gateway drew, so a run started
again makes the same codes), the response format and speed; a text-to-audio run: its GenerateRequest
(seeded likewise) and response format. A speech run whose text streams in from its client
(`streams_text`) cannot be continued elsewhere: the text source is that client's connection.
"""

from __future__ import annotations

import base64
import dataclasses
import json

from chorus.v1 import diffusion_pb2, talker_pb2


@dataclasses.dataclass(frozen=True)
class SpeechSpec:
    segments: list[talker_pb2.SynthesisRequest]
    response_format: str
    speed: float = 1.0
    streams_text: bool = False


@dataclasses.dataclass(frozen=True)
class GenerationSpec:
    request: diffusion_pb2.GenerateRequest
    response_format: str


RunSpec = SpeechSpec | GenerationSpec


def _b64(message) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


def encode_spec(spec: RunSpec) -> bytes:
    if isinstance(spec, SpeechSpec):
        fields = {
            "kind": "speech",
            "segments": [_b64(segment) for segment in spec.segments],
            "response_format": spec.response_format,
            "speed": spec.speed,
            "streams_text": spec.streams_text,
        }
    else:
        fields = {"kind": "audio", "request": _b64(spec.request), "response_format": spec.response_format}
    return json.dumps(fields).encode()


def decode_spec(data: bytes) -> RunSpec:
    fields = json.loads(data)
    if fields["kind"] == "speech":
        segments = [talker_pb2.SynthesisRequest.FromString(base64.b64decode(s)) for s in fields["segments"]]
        return SpeechSpec(segments, fields["response_format"], fields["speed"], fields["streams_text"])
    request = diffusion_pb2.GenerateRequest.FromString(base64.b64decode(fields["request"]))
    return GenerationSpec(request, fields["response_format"])
