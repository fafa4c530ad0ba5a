"""The gateway's codec options (faster mp3, opus and aac encoding) reach the codec and keep speech-like audio at
least as close to its input as the codecs' defaults do; `python -m chorus.bench.encoders` writes its report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chorus.bench import encoders
from chorus.gateway.audio import FORMATS, StreamingEncoder

WITH_OPTIONS = sorted(name for name, spec in FORMATS.items() if spec.codec_options)


def test_the_costly_codecs_have_options():
    assert {"mp3", "opus", "aac"} <= set(WITH_OPTIONS)


@pytest.mark.parametrize("format_name", WITH_OPTIONS)
def test_the_gateway_encoder_applies_the_options(format_name):
    spec, samples = FORMATS[format_name], encoders.speech_like(2.0)
    encoder = StreamingEncoder(format_name, encoders.SPEECH_RATE_HZ)
    streamed = b"".join(encoder.encode(chunk) for chunk in np.array_split(samples, encoders.CHUNKS)) + encoder.flush()
    # The audio, not the files: the bench's muxer writes to a seekable file, which tells a decoder to skip the codec
    # delay, the gateway's to a stream, which cannot (mp3 then decodes with the delay in front).
    heard = encoders.decode(streamed, spec.container)
    with_options = encoders.decode(encoders.encode(spec, samples, dict(spec.codec_options))[1], spec.container)
    with_defaults = encoders.decode(encoders.encode(spec, samples, {})[1], spec.container)
    assert encoders.closeness(with_options, heard)["snr_db"] > 100  # the same samples
    assert encoders.closeness(with_defaults, heard)["snr_db"] < 60, "the options change nothing: unseen if dropped"


@pytest.mark.parametrize("format_name", WITH_OPTIONS)
def test_the_options_keep_speech_as_well_as_the_defaults(format_name):
    spec, samples = FORMATS[format_name], encoders.speech_like(4.0)
    defaults = encoders.measure(spec, samples, {}, repeats=1)
    chosen = encoders.measure(spec, samples, dict(spec.codec_options), repeats=1)
    assert chosen["lsd_db"] <= defaults["lsd_db"] + 0.25, (chosen, defaults)
    assert chosen["snr_db"] >= defaults["snr_db"] - 0.5, (chosen, defaults)
    assert chosen["bytes"] <= 1.1 * defaults["bytes"]


def test_closeness_finds_the_delay_and_tells_distortion_apart():
    reference = encoders.speech_like(2.0)
    delayed = np.concatenate([np.zeros(1024), reference]).astype(np.float64)
    exact = encoders.closeness(reference, delayed)
    assert exact["delay_samples"] == 1024 and exact["snr_db"] > 100
    noisy = delayed + 0.02 * np.random.default_rng(1).standard_normal(len(delayed))
    assert encoders.closeness(reference, noisy)["snr_db"] < 20


def test_bench_writes_json_and_png(tmp_path):
    assert encoders.main(["--seconds", "1", "--repeats", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("encoders-*.json")
    report = json.loads(path.read_text())
    assert [row["format"] for row in report["results"]] == [n for n in FORMATS if FORMATS[n].codec_options]
    for row in report["results"]:
        assert row["chosen"]["options"] == dict(FORMATS[row["format"]].codec_options)
        assert row["chosen"]["cpu_ms_per_audio_s"] > 0 and row["defaults"]["cpu_ms_per_audio_s"] > 0
    assert [row["format"] for row in report["silence"]] == ["mp3", "opus", "aac"]
    assert all(row["flushed_cpu_ms_per_audio_s"] > 0 for row in report["silence"])
    assert path.with_suffix(".png").stat().st_size > 0
