"""`Diffusion.Generate` / `GetLoad` over a real gRPC server on loopback with the tiny model."""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.gateway.audio.encoder import _s16le
from chorus.runtime.host import ServiceHost
from chorus.v1 import common_pb2, diffusion_pb2, diffusion_pb2_grpc
from chorus.wire import chunk_to_pcm


@pytest.fixture
async def diffusion():
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    service = DiffusionService(config)
    host = ServiceHost(config, service)
    await host.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        yield diffusion_pb2_grpc.DiffusionStub(channel), service
    await host.stop()


async def test_a_warm_up_generation_runs_before_serving_and_leaves_the_engine_idle(caplog):
    caplog.set_level(logging.INFO)
    steps_before = REGISTRY.get_sample_value("chorus_diffusion_step_seconds_count") or 0.0
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    host = ServiceHost(config, DiffusionService(config))
    await host.start()
    try:
        messages = [record.getMessage() for record in caplog.records]
        warm_up = [i for i, message in enumerate(messages) if message.startswith("warm-up generation took")]
        assert len(warm_up) == 1 and warm_up[0] < messages.index("diffusion is SERVING")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            load = await diffusion_pb2_grpc.DiffusionStub(channel).GetLoad(common_pb2.GetLoadRequest())
        assert (load.live_streams, load.queue_depth, load.free_slots) == (0, 0, config.max_batch_size)
        steps_after = REGISTRY.get_sample_value("chorus_diffusion_step_seconds_count") or 0.0
        assert steps_after == steps_before, "the warm-up's steps count in the step metrics as a client's"
    finally:
        await host.stop()


async def generate(stub, **fields):
    messages = [m async for m in stub.Generate(diffusion_pb2.GenerateRequest(**fields))]
    progress = [m.progress.step for m in messages if m.HasField("progress")]
    audio = [m.audio for m in messages if m.HasField("audio")]
    return progress, audio, messages[-1].final


async def test_generate_streams_progress_then_audio_then_final(diffusion):
    stub, _ = diffusion
    progress, audio, final = await generate(stub, prompt="rain on a tin roof", duration_s=0.5, num_steps=4, seed=3)
    assert progress == [1, 2, 3, 4]
    samples = np.concatenate([chunk_to_pcm(a.pcm) for a in audio])
    assert audio[0].pcm.sample_rate_hz == 44100 and samples.shape == (round(0.5 * 44100), 2)
    assert np.isfinite(samples).all() and np.abs(samples).max() > 0
    assert final.reason == common_pb2.FINISH_REASON_COMPLETE and final.usage.num_steps == 4
    again = await generate(stub, prompt="rain on a tin roof", duration_s=0.5, num_steps=4, seed=3)
    np.testing.assert_array_equal(np.concatenate([chunk_to_pcm(a.pcm) for a in again[1]]), samples)


async def test_int16_audio_is_the_float_audio_converted_as_a_16_bit_file_holds_it(diffusion):
    stub, _ = diffusion
    request = {"prompt": "rain on a tin roof", "duration_s": 0.5, "num_steps": 3, "seed": 6}
    _, floats, _ = await generate(stub, **request)
    _, ints, final = await generate(stub, **request, sample_format=common_pb2.SAMPLE_FORMAT_PCM_S16LE)
    assert final.reason == common_pb2.FINISH_REASON_COMPLETE
    assert {a.pcm.format for a in floats} == {common_pb2.SAMPLE_FORMAT_PCM_F32LE}
    assert {a.pcm.format for a in ints} == {common_pb2.SAMPLE_FORMAT_PCM_S16LE}
    float_samples = np.concatenate([chunk_to_pcm(a.pcm) for a in floats])
    assert b"".join(a.pcm.data for a in ints) == _s16le(float_samples)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "duration_s": 60}, "duration_s"),
        ({"prompt": "x", "num_steps": 100000}, "num_steps"),
        ({"prompt": "x", "guidance_scale": -1}, "guidance_scale"),
    ],
)
async def test_bad_requests_get_invalid_argument_naming_the_field(diffusion, fields, param):
    stub, _ = diffusion
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate(stub, **fields)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert param in failure.value.details()


async def test_cancelling_mid_run_frees_the_slot(diffusion):
    stub, _service = diffusion
    call = stub.Generate(diffusion_pb2.GenerateRequest(prompt="wind", duration_s=0.5, num_steps=1000))
    first = await call.read()
    assert first.progress.step == 1
    call.cancel()
    for _ in range(200):
        load = await stub.GetLoad(common_pb2.GetLoadRequest())
        if load.live_streams == 0:
            break
        await asyncio.sleep(0.02)
    assert load.live_streams == 0 and load.queue_depth == 0
