"""`POST /v1/audio/speech` as multipart/form-data (ref_audio as a file) against the real tiny stack."""

from __future__ import annotations

import base64
import io
import json

import av
import pytest
from speech_stack import reference_wav, speech_stack

FIELDS = {"model": "tiny", "input": "Hello there.", "language": "english", "seed": "3", "max_frames": "30"}


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    async with speech_stack(start_gateway, redis_url, str(tmp_path), max_ref_audio_bytes=100_000) as stack:
        yield stack[1]


def file_part(data: bytes) -> dict:
    return {"ref_audio": ("reference.wav", data, "audio/wav")}


async def test_an_uploaded_reference_clones_like_the_same_audio_in_json(stack):
    http = stack
    reference = reference_wav()
    fields = FIELDS | {"ref_text": "A tone.", "response_format": "pcm"}
    uploaded = await http.post("/v1/audio/speech", data=fields, files=file_part(reference))
    assert uploaded.status_code == 200, uploaded.text
    as_json = {**fields, "seed": 3, "max_frames": 30, "ref_audio": base64.b64encode(reference).decode()}
    sent_as_json = await http.post("/v1/audio/speech", json=as_json)
    assert sent_as_json.status_code == 200 and len(uploaded.content) > 0
    assert uploaded.content == sent_as_json.content  # seeded: the encoding of the body changes nothing


async def test_form_fields_take_sampling_as_json_and_stream_wav(stack):
    http = stack
    fields = FIELDS | {"x_vector_only": "true", "response_format": "wav", "sampling": json.dumps({"greedy": True})}
    reply = await http.post("/v1/audio/speech", data=fields, files=file_part(reference_wav()))
    assert reply.status_code == 200, reply.text
    with av.open(io.BytesIO(reply.content)) as container:
        assert container.streams.audio[0].rate == 24_000
        assert sum(frame.samples for frame in container.decode(audio=0)) > 0


@pytest.mark.parametrize(
    ("fields", "files", "status", "param"),
    [
        (FIELDS | {"speed": "9"}, None, 400, "speed"),
        (FIELDS | {"sampling": "{not json"}, None, 400, "sampling"),
        ({"input": "Hello."}, None, 422, "model"),
        (FIELDS | {"surprise": "1"}, None, 422, "surprise"),
        (FIELDS, {"ref_audio": ("a.txt", b"not audio at all", "text/plain")}, 400, "ref_audio"),
        (FIELDS, {"input": ("input.txt", b"Hello.", "text/plain")}, 400, "input"),
        (FIELDS, {"ref_audio": ("big.wav", b"\0" * 100_001, "audio/wav")}, 413, None),
    ],
)
async def test_bad_form_input_answers_the_error_envelope(stack, fields, files, status, param):
    http = stack
    reply = await http.post("/v1/audio/speech", data=fields, files=files or file_part(reference_wav()))
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"]


async def test_a_body_over_the_limit_is_413_and_the_openapi_schema_lists_both_encodings(
    start_gateway, redis_url, tmp_path
):
    async with speech_stack(start_gateway, redis_url, str(tmp_path), max_body_bytes=50_000) as (_, http, *_):
        reply = await http.post("/v1/audio/speech", data=FIELDS, files=file_part(b"\0" * 60_000))
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
        schema = (await http.get("/openapi.json")).json()
    content = schema["paths"]["/v1/audio/speech"]["post"]["requestBody"]["content"]
    assert content["application/json"]["schema"]["$ref"].endswith("/SpeechRequest")
    upload = content["multipart/form-data"]["schema"]["properties"]
    assert upload["ref_audio"]["format"] == "binary" and {"input", "voice", "sampling"} <= set(upload)
