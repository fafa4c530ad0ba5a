"""Voice clone: the talker runs its speaker encoder once per distinct reference audio (cached by hash),
and a request served from the cache gives the same codes as the one that ran the encoder."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY
from speech_stack import hosted, reference_wav

from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService
from chorus.talker.speaker_cache import SpeakerVectorCache
from chorus.v1 import talker_pb2, talker_pb2_grpc
from chorus.wire import chunk_to_codes


@pytest.fixture
async def talker(tmp_path):
    config = TalkerConfig(
        device="cpu", metrics_port=-1, max_streams=2, chunk_frames=4, max_frames=12, grace_s=1.0,
        cache_dir=str(tmp_path), use_cuda_graphs=False,
    )  # fmt: skip
    service = TalkerService(config)
    async with hosted(config, service) as target, grpc.aio.insecure_channel(target) as channel:
        yield service, talker_pb2_grpc.TalkerStub(channel)


async def clone_codes(stub, reference_audio: bytes, request_id: str, speaker_embedding=()) -> np.ndarray:
    clone = talker_pb2.VoiceClone(reference_audio=reference_audio, speaker_embedding=speaker_embedding)
    clone.x_vector_only = True
    request = talker_pb2.SynthesisRequest(
        request_id=request_id, text="Hello there.", language="english", seed=7, max_frames=12, ignore_eos=True,
        task_type=talker_pb2.TASK_TYPE_VOICE_CLONE, voice_clone=clone,
    )  # fmt: skip
    outputs = [output async for output in stub.Synthesize(iter([talker_pb2.SynthesizeInput(request=request)]))]
    chunks = [chunk_to_codes(output.chunk, "chunk") for output in outputs if output.HasField("chunk")]
    return np.concatenate(chunks)


def lookups(outcome: str) -> float:
    return REGISTRY.get_sample_value("chorus_talker_speaker_cache_lookups_total", {"outcome": outcome}) or 0.0


async def test_the_encoder_runs_once_per_reference_and_cached_vectors_give_the_same_codes(talker):
    service, stub = talker
    runner = service.engine.runner
    encoder_calls = []
    embed = runner.speaker_vector

    def counting_speaker_vector(audio):
        encoder_calls.append(audio.shape)
        return embed(audio)

    runner.speaker_vector = counting_speaker_vector  # the real encoder still runs; this only counts calls
    reference = reference_wav()
    misses, hits = lookups("miss"), lookups("hit")
    first = await clone_codes(stub, reference, "clone.0")
    second = await clone_codes(stub, reference, "clone.1")
    assert len(encoder_calls) == 1 and first.shape == (12, 16)
    assert np.array_equal(first, second)  # same seed, same (cached) speaker vector: same codes
    assert (lookups("miss") - misses, lookups("hit") - hits) == (1, 1)

    other = reference_wav()[:-4000]  # a different file: embedded anew
    await clone_codes(stub, other, "clone.2")
    assert len(encoder_calls) == 2 and lookups("miss") - misses == 2


async def test_embed_speaker_gives_the_vector_that_clones_like_the_reference_audio(talker):
    service, stub = talker
    reference = reference_wav()
    from_audio = await clone_codes(stub, reference, "clone.audio")  # embedded at prefill
    service.speaker_vectors = SpeakerVectorCache()  # so EmbedSpeaker runs the encoder again, on its own
    reply = await stub.EmbedSpeaker(talker_pb2.EmbedSpeakerRequest(audio=reference))
    assert len(reply.speaker_embedding) == service.engine.model_config.talker.hidden_size
    from_vector = await clone_codes(stub, b"", "clone.vector", speaker_embedding=reply.speaker_embedding)
    assert np.array_equal(from_audio, from_vector)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.EmbedSpeaker(talker_pb2.EmbedSpeakerRequest(audio=b"not audio"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and refused.value.details().startswith("audio")


def test_the_cache_is_a_bounded_lru():
    cache = SpeakerVectorCache(max_entries=2)
    vectors = {name: np.full(4, index) for index, name in enumerate("abc")}
    cache.put("a", vectors["a"])
    cache.put("b", vectors["b"])
    assert cache.get("a") is vectors["a"]  # "a" is now the most recent
    cache.put("c", vectors["c"])
    assert cache.get("b") is None and cache.get("a") is vectors["a"] and cache.get("c") is vectors["c"]
    with pytest.raises(ValueError, match="max_entries"):
        SpeakerVectorCache(max_entries=0)
