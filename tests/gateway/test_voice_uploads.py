"""Bad voice uploads each answer their 4xx with the error envelope, naming the field (real tiny stack)."""

from __future__ import annotations

import base64
import uuid

import pytest
from speech_stack import reference_wav, speech_stack

MAX_FILE_BYTES = 200_000
MAX_REFERENCE_S = 2.0
MAX_VOICES = 3


@pytest.fixture
async def http(start_gateway, redis_url, tmp_path):
    key = f"uploads-{uuid.uuid4().hex}"
    limits = {"max_ref_audio_bytes": MAX_FILE_BYTES, "max_voice_reference_s": MAX_REFERENCE_S}
    async with speech_stack(
        start_gateway, redis_url, str(tmp_path), api_keys=(key,), max_voices_per_key=MAX_VOICES, **limits
    ) as (_, http, *_):
        http.headers["Authorization"] = f"Bearer {key}"
        yield http


def upload(name: str, audio: bytes = b"", **fields) -> dict:
    """httpx arguments of a multipart upload (the file part even when `audio` is empty)."""
    return {"data": {"name": name, **fields}, "files": {"audio": ("voice.wav", audio, "audio/wav")}}


def check_error(reply, status: int, param: str | None, code: str | None = None) -> None:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error", error
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error


BAD_UPLOADS = [
    ("empty file", upload("empty"), 400, "audio"),
    ("not audio", upload("text", b"certainly not audio " * 50), 400, "audio"),
    ("too long", upload("long", reference_wav(MAX_REFERENCE_S + 1)), 400, "audio"),
    ("too large", upload("big", b"\0" * (MAX_FILE_BYTES + 1)), 413, None),
    ("path in the name", upload("../voices/evil", reference_wav()), 400, "name"),
    ("slash in the name", upload("a/b", reference_wav()), 400, "name"),
    ("control character in the name", upload("tab\there", reference_wav()), 400, "name"),
    ("name shaped like an id", upload("voice_0123", reference_wav()), 400, "name"),
    ("name too long", upload("n" * 65, reference_wav()), 400, "name"),
    ("empty name", upload("", reference_wav()), 400, "name"),
    ("neither audio nor instructions", {"json": {"name": "nothing"}}, 400, "audio"),
    ("audio and instructions", upload("both", reference_wav(), instructions="Calm."), 400, "instructions"),
    ("ref_text without audio", {"json": {"name": "t", "instructions": "Calm.", "ref_text": "Hi."}}, 400, "ref_text"),
    ("audio not base64", {"json": {"name": "b64", "audio": "%%%"}}, 400, "audio"),
    ("unknown field", {"json": {"name": "x", "instructions": "Calm.", "pitch": 3}}, 422, "pitch"),
]


async def test_bad_uploads_answer_their_4xx_with_the_envelope(http):
    for case, arguments, status, param in BAD_UPLOADS:
        reply = await http.post("/v1/audio/voices", **arguments)
        assert reply.status_code == status, (case, reply.text)
        check_error(reply, status, param)
    listed = (await http.get("/v1/audio/voices")).json()
    assert [voice for voice in listed["data"] if voice["kind"] != "builtin"] == []  # nothing was saved


async def test_names_are_unique_per_key_builtins_are_taken_and_the_count_is_limited(http):
    reference = reference_wav()
    dana = await http.post("/v1/audio/voices", **upload("Dana", reference))
    assert dana.status_code == 201 and dana.json()["x_vector_only"] is True  # no transcript: no in-context cloning
    check_error(await http.post("/v1/audio/voices", **upload("dana", reference)), 409, "name", "already_exists")
    check_error(await http.post("/v1/audio/voices", **upload("Ryan", reference)), 409, "name", "already_exists")
    as_json = {"name": "Eve", "audio": base64.b64encode(reference).decode()}
    assert (await http.post("/v1/audio/voices", json=as_json)).status_code == 201
    assert (await http.post("/v1/audio/voices", json={"name": "Fay", "instructions": "Calm."})).status_code == 201
    full = await http.post("/v1/audio/voices", json={"name": "Gus", "instructions": "Calm."})
    check_error(full, 400, None, "limit_reached")
    assert str(MAX_VOICES) in full.json()["error"]["message"]
    assert (await http.delete("/v1/audio/voices/Fay")).status_code == 200
    assert (await http.post("/v1/audio/voices", json={"name": "Gus", "instructions": "Calm."})).status_code == 201
