"""Saved voices over REST and gRPC on the real tiny stack (talker, vocoder, gateway, Redis): a voice named in a
speech request gives exactly the audio of the same request with its reference sent inline."""

from __future__ import annotations

import base64
import json
import uuid

import grpc
import numpy as np
import openai
import pytest
from speech_stack import reference_wav, speech_stack

from chorus.gateway.state import keys
from chorus.gateway.state.auth import hash_key
from chorus.v1 import gateway_pb2, gateway_pb2_grpc, talker_pb2, talker_pb2_grpc

SPEECH = {"model": "tiny", "input": "Hello there.", "language": "english", "seed": 3, "max_frames": 30}
PCM = SPEECH | {"response_format": "pcm"}


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    """(gateway, http client with a key of its own (so its voices are this test's alone), talker, gRPC target, key)."""
    key = f"voices-{uuid.uuid4().hex}"
    async with speech_stack(start_gateway, redis_url, str(tmp_path), api_keys=(key,)) as (gateway, http, target, *rest):
        http.headers["Authorization"] = f"Bearer {key}"
        yield gateway, http, rest[0], target, key


def as_base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_saved_voice_speaks_exactly_as_its_reference_sent_inline(stack):
    _, http, _, _, _ = stack
    reference = reference_wav()
    fields = {"name": "Alice", "ref_text": "A tone.", "language": "english"}
    created = await http.post("/v1/audio/voices", data=fields, files={"audio": ("alice.wav", reference, "audio/wav")})
    assert created.status_code == 201, created.text
    voice = created.json()
    assert voice["id"].startswith("voice_") and created.headers["location"] == f"/v1/audio/voices/{voice['id']}"
    assert {key: voice[key] for key in ("object", "name", "kind", "model", "ref_text", "x_vector_only")} == {
        "object": "audio.voice", "name": "Alice", "kind": "clone", "model": "tiny", "ref_text": "A tone.",
        "x_vector_only": False,
    }  # fmt: skip
    assert voice["ref_duration_s"] == pytest.approx(1.0, abs=0.05) and voice["created_at"] > 0

    inline = await http.post("/v1/audio/speech", json=PCM | {"ref_audio": as_base64(reference), "ref_text": "A tone."})
    assert inline.status_code == 200 and len(inline.content) > 0
    for name in ("Alice", "alice", voice["id"]):  # by name (any case) or id
        by_name = await http.post("/v1/audio/speech", json=PCM | {"voice": name})
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == inline.content  # seeded: the stored codes and embedding are what inline computes
    record = (await http.get(f"/v1/requests/{by_name.headers['x-request-id']}")).json()
    assert record["voice"] == voice["id"] and record["status"] == "done"

    form = {name: (None, str(value)) for name, value in (PCM | {"voice": "Alice"}).items()}  # multipart, no file
    as_form = await http.post("/v1/audio/speech", files=form)
    audio = b""
    async with http.stream("POST", "/v1/audio/speech", json=PCM | {"voice": "Alice", "stream_format": "sse"}) as sse:
        async for line in sse.aiter_lines():
            if line.startswith("data: ") and (event := json.loads(line[6:]))["type"] == "speech.audio.delta":
                audio += base64.b64decode(event["audio"])
    assert as_form.content == audio == inline.content


async def test_an_x_vector_voice_from_json_and_a_precomputed_embedding_clone_like_the_reference(stack):
    _, http, talker, _, _ = stack
    reference = reference_wav()
    body = {"name": "Bob", "audio": "data:audio/wav;base64," + as_base64(reference), "x_vector_only": True}
    created = await http.post("/v1/audio/voices", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["x_vector_only"] is True and created.json()["ref_text"] is None
    inline = await http.post("/v1/audio/speech", json=PCM | {"ref_audio": as_base64(reference), "x_vector_only": True})
    by_name = await http.post("/v1/audio/speech", json=PCM | {"voice": "Bob"})
    assert inline.status_code == by_name.status_code == 200 and by_name.content == inline.content

    async with grpc.aio.insecure_channel(talker) as channel:
        reply = await talker_pb2_grpc.TalkerStub(channel).EmbedSpeaker(talker_pb2.EmbedSpeakerRequest(audio=reference))
    embedding = as_base64(np.asarray(reply.speaker_embedding, dtype="<f4").tobytes())
    by_embedding = await http.post("/v1/audio/speech", json=PCM | {"speaker_embedding": embedding})
    assert by_embedding.status_code == 200 and by_embedding.content == inline.content
    bad = await http.post("/v1/audio/speech", json=PCM | {"speaker_embedding": as_base64(b"\0\0\0")})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speaker_embedding"


async def test_a_designed_voice_speaks_like_its_instructions_inline(stack):
    _, http, _, _, _ = stack
    instructions = "A calm, low narrator."
    created = await http.post("/v1/audio/voices", json={"name": "Narrator", "instructions": instructions})
    assert created.status_code == 201, created.text
    assert created.json()["kind"] == "design" and created.json()["instructions"] == instructions
    inline = await http.post("/v1/audio/speech", json=PCM | {"task_type": "voice_design", "instructions": instructions})
    by_name = await http.post("/v1/audio/speech", json=PCM | {"voice": "Narrator"})
    assert inline.status_code == by_name.status_code == 200 and by_name.content == inline.content
    refused = await http.post("/v1/audio/speech", json=PCM | {"voice": "Narrator", "instructions": "Loud."})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "instructions"


async def test_list_pages_get_and_delete(stack):
    _, http, _, _, _ = stack
    ids = []
    for name in ("one", "two", "three"):
        created = await http.post("/v1/audio/voices", json={"name": name, "instructions": f"Voice {name}."})
        ids.append(created.json()["id"])
    first = (await http.get("/v1/audio/voices")).json()
    builtins = [voice["id"] for voice in first["data"] if voice["kind"] == "builtin"]
    assert first["object"] == "list" and first["has_more"] is False and "ryan" in builtins
    assert [voice["id"] for voice in first["data"]] == builtins + ids  # built-ins, then saved voices, oldest first
    assert first["voices"] == builtins and first["model"] == "tiny" and "english" in first["languages"]
    assert {"custom_voice", "voice_design", "voice_clone"} == set(first["task_types"])

    walked, after = [], None
    while True:
        params = {"limit": 2} | ({"after": after} if after else {})
        page = (await http.get("/v1/audio/voices", params=params)).json()
        walked += [voice["id"] for voice in page["data"]]
        assert len(page["data"]) <= 2 and page["last_id"] == page["data"][-1]["id"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert walked == builtins + ids
    unknown = await http.get("/v1/audio/voices", params={"after": "voice_nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "after"

    assert (await http.get(f"/v1/audio/voices/{ids[1]}")).json()["name"] == "two"
    assert (await http.get("/v1/audio/voices/TWO")).json()["id"] == ids[1]
    assert (await http.get("/v1/audio/voices/ryan")).json()["kind"] == "builtin"
    deleted = await http.delete("/v1/audio/voices/two")
    assert deleted.json() == {"id": ids[1], "object": "audio.voice.deleted", "deleted": True}
    for reply in (
        await http.get(f"/v1/audio/voices/{ids[1]}"),
        await http.delete(f"/v1/audio/voices/{ids[1]}"),
        await http.post("/v1/audio/speech", json=PCM | {"voice": "two"}),
    ):
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found", reply.text
    listed = (await http.get("/v1/audio/voices")).json()
    assert [voice["id"] for voice in listed["data"]] == [*builtins, ids[0], ids[2]]
    # The name is free again.
    assert (await http.post("/v1/audio/voices", json={"name": "Two", "instructions": "Again."})).status_code == 201


async def test_a_voice_made_for_another_model_is_refused(stack):
    gateway, http, _, _, key = stack
    voice = (await http.post("/v1/audio/voices", json={"name": "Old", "instructions": "Old voice."})).json()
    # As if it had been saved while another checkpoint was loaded.
    await gateway.context.redis.hset(keys.voice(hash_key(key)[:12], voice["id"]), "model", "Qwen3-TTS-12Hz-1.7B-Base")
    refused = await http.post("/v1/audio/speech", json=PCM | {"voice": "Old"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "voice" and "Qwen3-TTS-12Hz-1.7B-Base" in error["message"]


async def test_the_openai_sdk_saves_speaks_with_and_deletes_a_voice(stack):
    gateway, http, talker, _, key = stack
    sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gateway.rest_port}/v1", api_key=key, max_retries=0)
    reference = reference_wav()
    body = {"name": "Sdk", "audio": "data:audio/wav;base64," + as_base64(reference), "ref_text": "A tone."}
    voice = await sdk.post("/audio/voices", cast_to=object, body=body)  # the SDK's call for any endpoint
    extensions = {key: SPEECH[key] for key in ("language", "seed", "max_frames")}
    spoken = [
        await sdk.audio.speech.create(
            model="tiny", voice=named, input=SPEECH["input"], response_format="pcm", extra_body=extensions
        )
        for named in ("Sdk", {"id": voice["id"]})  # a name, or the SDK's custom-voice reference
    ]
    inline = await http.post("/v1/audio/speech", json=PCM | {"ref_audio": as_base64(reference), "ref_text": "A tone."})
    assert spoken[0].content == spoken[1].content == inline.content and len(inline.content) > 0
    deleted = await sdk.audio.voices.delete(voice["id"])
    assert (deleted.id, deleted.deleted, deleted.object) == (voice["id"], True, "audio.voice.deleted")

    async with grpc.aio.insecure_channel(talker) as channel:
        reply = await talker_pb2_grpc.TalkerStub(channel).EmbedSpeaker(talker_pb2.EmbedSpeakerRequest(audio=reference))
    embedding = as_base64(np.asarray(reply.speaker_embedding, dtype="<f4").tobytes())
    extensions |= {"speaker_embedding": embedding}  # the SDK must send a voice: "" names none
    by_embedding = await sdk.audio.speech.create(
        model="tiny", voice="", input=SPEECH["input"], response_format="pcm", extra_body=extensions
    )
    inline = await http.post("/v1/audio/speech", json=PCM | {"ref_audio": as_base64(reference), "x_vector_only": True})
    assert by_embedding.content == inline.content
    await sdk.close()


async def test_grpc_voices_save_list_speak_and_delete(stack):
    _, http, talker, target, key = stack
    metadata = (("authorization", f"Bearer {key}"),)
    reference = reference_wav()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        request = gateway_pb2.CreateVoiceRequest(name="Carol", audio=reference, ref_text="A tone.")
        voice = await stub.CreateVoice(request, metadata=metadata)
        assert voice.id.startswith("voice_") and voice.task_type == talker_pb2.TASK_TYPE_VOICE_CLONE
        assert voice.model == "tiny" and voice.ref_duration_s == pytest.approx(1.0, abs=0.05)
        with pytest.raises(grpc.aio.AioRpcError) as taken:
            await stub.CreateVoice(request, metadata=metadata)
        assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
        for bad in ({"name": "a/b", "audio": reference}, {"name": "no audio"}):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateVoice(gateway_pb2.CreateVoiceRequest(**bad), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(("name", "audio"))
        listed = await stub.ListVoices(gateway_pb2.VoiceListRequest(), metadata=metadata)
        assert [v.id for v in listed.voices if v.task_type == talker_pb2.TASK_TYPE_VOICE_CLONE] == [voice.id]
        assert (await stub.GetVoice(gateway_pb2.VoiceRef(voice="carol"), metadata=metadata)) == voice

        speak = gateway_pb2.SpeakRequest(
            model="tiny", input="Hello there.", voice="Carol", language="english", seed=3, max_frames=30,
            response_format=gateway_pb2.AUDIO_FORMAT_PCM,
        )  # fmt: skip
        spoken = [output async for output in stub.Speak(speak, metadata=metadata)]
        streamed = [
            output
            async for output in stub.SpeakStream(
                iter([gateway_pb2.SpeakInput(request=speak), gateway_pb2.SpeakInput(end_of_input=True)]),
                metadata=metadata,
            )
        ]
        assert streamed[-1].final.error.code == "" and any(output.HasField("audio") for output in streamed)
        async with grpc.aio.insecure_channel(talker) as talker_channel:
            embedded = await talker_pb2_grpc.TalkerStub(talker_channel).EmbedSpeaker(
                talker_pb2.EmbedSpeakerRequest(audio=reference)
            )
        speak_embedding = gateway_pb2.SpeakRequest()
        speak_embedding.CopyFrom(speak)
        speak_embedding.voice = ""  # no saved voice: the precomputed x-vector alone
        speak_embedding.speaker_embedding = np.asarray(embedded.speaker_embedding, dtype="<f4").tobytes()
        by_embedding = [output async for output in stub.Speak(speak_embedding, metadata=metadata)]
        deleted = await stub.DeleteVoice(gateway_pb2.VoiceRef(voice=voice.id), metadata=metadata)
        assert deleted.id == voice.id
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.GetVoice(gateway_pb2.VoiceRef(voice=voice.id), metadata=metadata)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    audio = b"".join(output.audio.data for output in spoken if output.HasField("audio"))
    inline = await http.post("/v1/audio/speech", json=PCM | {"ref_audio": as_base64(reference), "ref_text": "A tone."})
    assert len(audio) > 0 and audio == inline.content
    x_vector = {"ref_audio": as_base64(reference), "x_vector_only": True}
    inline_x_vector = await http.post("/v1/audio/speech", json=PCM | x_vector)
    assert b"".join(output.audio.data for output in by_embedding if output.HasField("audio")) == inline_x_vector.content
