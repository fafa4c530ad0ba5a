"""`Vocoder.Encode` through the engine: uploaded audio → the encoder's codes, and its input errors."""

from __future__ import annotations

import io
import math

import av
import numpy as np
import pytest
import torch

from chorus.vocoder.audio_io import AudioInputError
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.engine.build import build_engine
from chorus.vocoder.engine.engine import EngineSettings


def _wav_bytes(waveform: np.ndarray, rate_hz: int) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="wav") as container:
        stream = container.add_stream("pcm_f32le", rate=rate_hz)
        stream.layout = "mono"
        stream.format = "flt"
        frame = av.AudioFrame.from_ndarray(waveform[None].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = rate_hz
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


@pytest.fixture
async def engine():
    engine = build_engine(
        VocoderConfig(model="tiny", device="cpu", max_streams=2), EngineSettings(max_reference_audio_s=5)
    )
    await engine.start()
    yield engine
    await engine.stop()


async def test_encode_returns_the_encoders_codes(engine):
    t = np.arange(int(1.7 * 24000)) / 24000
    waveform = (0.4 * np.sin(2 * math.pi * 300 * t) * np.sin(2 * math.pi * 3 * t)).astype(np.float32)
    encoded = await engine.encode(_wav_bytes(waveform, 24000))
    assert encoded.audio_s == pytest.approx(1.7, abs=1e-3)
    assert encoded.codes.shape == (math.ceil(waveform.size / 1920), 16)
    with torch.inference_mode():
        direct = engine.encoder(torch.from_numpy(waveform)[None])[0].numpy()
    np.testing.assert_array_equal(encoded.codes, direct)


async def test_encode_resamples_other_rates(engine):
    t = np.arange(16000) / 16000
    encoded = await engine.encode(_wav_bytes((0.3 * np.sin(2 * math.pi * 220 * t)).astype(np.float32), 16000))
    assert encoded.audio_s == pytest.approx(1.0, abs=2e-3)
    assert encoded.codes.shape == (13, 16)


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"", "empty"), (b"\x00\x01garbage" * 50, "cannot decode"), (None, "longer than the 5 s limit")],
)
async def test_encode_rejects_bad_audio(engine, data, message):
    if data is None:
        data = _wav_bytes(np.zeros(6 * 24000, dtype=np.float32), 24000)
    with pytest.raises(AudioInputError, match=message):
        await engine.encode(data)
    assert engine.stats().live_streams == 0
