"""Saved voices belong to the API key that saved them, and live in Redis: a restarted gateway still has them."""

from __future__ import annotations

import uuid

import grpc
import pytest
from speech_stack import hosted, reference_wav, speech_stack, until_healthy

from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService
from chorus.v1 import gateway_pb2, gateway_pb2_grpc
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.service import VocoderService

PCM = {"model": "tiny", "input": "Hello there.", "language": "english", "seed": 3, "max_frames": 30}
PCM["response_format"] = "pcm"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def upload(name: str) -> dict:
    return {"data": {"name": name, "ref_text": "A tone."}, "files": {"audio": ("v.wav", reference_wav(), "audio/wav")}}


async def test_a_key_sees_uses_and_deletes_only_its_own_voices(start_gateway, redis_url, tmp_path):
    key_a, key_b = f"owner-a-{uuid.uuid4().hex}", f"owner-b-{uuid.uuid4().hex}"
    async with speech_stack(start_gateway, redis_url, str(tmp_path), api_keys=(key_a, key_b)) as (_, http, target, *_):
        a, b = bearer(key_a), bearer(key_b)
        voice = (await http.post("/v1/audio/voices", headers=a, **upload("Alice"))).json()
        speech_a = await http.post("/v1/audio/speech", headers=a, json=PCM | {"voice": "Alice"})
        assert speech_a.status_code == 200

        # To key B, key A's voice does not exist: 404 by name and by id, never 403.
        for ref in ("Alice", voice["id"]):
            for reply in (
                await http.get(f"/v1/audio/voices/{ref}", headers=b),
                await http.delete(f"/v1/audio/voices/{ref}", headers=b),
                await http.post("/v1/audio/speech", headers=b, json=PCM | {"voice": ref}),
            ):
                assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found", reply.text
        listed_by_b = (await http.get("/v1/audio/voices", headers=b)).json()
        assert all(listed["kind"] == "builtin" for listed in listed_by_b["data"])
        assert (await http.get("/v1/audio/voices", headers=b, params={"after": voice["id"]})).status_code == 400
        async with grpc.aio.insecure_channel(target) as channel:
            stub = gateway_pb2_grpc.ChorusStub(channel)
            metadata = (("authorization", f"Bearer {key_b}"),)
            for call in (
                stub.GetVoice(gateway_pb2.VoiceRef(voice=voice["id"]), metadata=metadata),
                stub.DeleteVoice(gateway_pb2.VoiceRef(voice="Alice"), metadata=metadata),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            speak = gateway_pb2.SpeakRequest(model="tiny", input="Hello.", voice="Alice", max_frames=30)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [output async for output in stub.Speak(speak, metadata=metadata)]
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND

        # Names are unique per key: B may have an Alice of its own, and deleting it leaves A's.
        assert (await http.post("/v1/audio/voices", headers=b, **upload("Alice"))).status_code == 201
        assert (await http.delete("/v1/audio/voices/alice", headers=b)).status_code == 200
        again = await http.post("/v1/audio/speech", headers=a, json=PCM | {"voice": "Alice"})
        assert again.status_code == 200 and again.content == speech_a.content
        assert (await http.get("/v1/audio/voices/Alice")).status_code == 401  # no key, no voices


async def test_without_api_keys_every_caller_shares_one_namespace(start_gateway, redis_url, tmp_path):
    name = f"shared-{uuid.uuid4().hex[:8]}"
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, *_):
        created = (await http.post("/v1/audio/voices", json={"name": name, "instructions": "Calm."})).json()
        other_caller = bearer("any-key-is-ignored-without-auth")
        assert (await http.get(f"/v1/audio/voices/{name}", headers=other_caller)).json()["id"] == created["id"]
        assert (await http.delete(f"/v1/audio/voices/{created['id']}", headers=other_caller)).status_code == 200


async def test_voices_outlive_a_gateway_restart(start_gateway, redis_url, tmp_path):
    key = f"restart-{uuid.uuid4().hex}"
    talker_config = TalkerConfig(
        device="cpu", metrics_port=-1, max_streams=4, chunk_frames=4, max_frames=40, grace_s=1.0,
        cache_dir=str(tmp_path), use_cuda_graphs=False,
    )  # fmt: skip
    vocoder_config = VocoderConfig(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0)
    async with (
        hosted(talker_config, TalkerService(talker_config)) as talker,
        hosted(vocoder_config, VocoderService(vocoder_config)) as vocoder,
    ):
        settings = {"talker_targets": (talker,), "vocoder_targets": (vocoder,), "api_keys": (key,)}
        async with start_gateway(redis_url, **settings) as (gateway, http, _):
            await until_healthy(gateway)
            http.headers.update(bearer(key))
            assert (await http.post("/v1/audio/voices", **upload("Keeper"))).status_code == 201
            before = await http.post("/v1/audio/speech", json=PCM | {"voice": "Keeper"})
        async with start_gateway(redis_url, **settings) as (gateway, http, target):  # a new gateway process's state
            await until_healthy(gateway)
            http.headers.update(bearer(key))
            after = await http.post("/v1/audio/speech", json=PCM | {"voice": "Keeper"})
            async with grpc.aio.insecure_channel(target) as channel:
                listed = await gateway_pb2_grpc.ChorusStub(channel).ListVoices(
                    gateway_pb2.VoiceListRequest(), metadata=(("authorization", f"Bearer {key}"),)
                )
    assert before.status_code == after.status_code == 200 and after.content == before.content
    assert "Keeper" in [voice.name for voice in listed.voices]
