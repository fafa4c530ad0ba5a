"""`python -m chorus.bench.encoders`: what the gateway's codec options cost and keep, against the codecs' defaults.

For each lossy format with options (`FORMATS[...].codec_options`), 10 s of speech-like audio at the speech rate is
encoded in the chunks a stream sends, once with the codec's defaults and once with the options, on this thread:
its CPU time per second of audio (what a gateway worker spends), the bytes, and how close the decoded audio stays
to the input (log-spectral distance over 0-8 kHz, the band both codecs keep at these bitrates, and SNR, both after
aligning away the codec's delay). The audio is synthetic, not speech: a voice-like harmonic series with a gliding
pitch, three formants, syllable envelopes and breath noise, so the figures compare the options with each other, not
with a listening test. It also times the streamed formats on silence, which TTS output has before, after and
between phrases, on a gateway encoder thread (denormals flushed to zero) and on this one (not flushed): libopus
slows down several times there without flushing. JSON + PNG (CPU ms per audio second: options beside defaults, then
silence flushed beside not flushed) land in `--out`.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from pathlib import Path

import av
import numpy as np

from chorus.bench.report import commit
from chorus.bench_png import write_grouped_bars
from chorus.gateway.audio.encoder_threads import EncoderThreads
from chorus.gateway.audio.formats import FORMATS, AudioFormatSpec

SPEECH_RATE_HZ = 24_000
CHUNKS = 11  # a 10 s stream's chunks (the vocoder's growing chunks, rounded)
MAX_DELAY_SAMPLES = 4_000  # past any of these codecs' priming
BAND_HZ = 8_000


def speech_like(seconds: float, rate_hz: int = SPEECH_RATE_HZ, seed: int = 0) -> np.ndarray:
    """Mono float32 in [-0.3, 0.3]: harmonics of a pitch gliding 100-220 Hz under formants at 500, 1500 and 2800 Hz,
    2.5 syllables a second, breath noise inside them."""
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    pitch = 160 + 60 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate_hz
    voice = np.zeros_like(t)
    for harmonic in range(1, 31):
        frequency = harmonic * pitch
        formants = sum(
            gain * np.exp(-(((frequency - center) / width) ** 2))
            for center, width, gain in ((500, 300, 1.0), (1500, 400, 0.6), (2800, 500, 0.3))
        )
        voice += (formants + 0.02) * np.sin(harmonic * phase) / harmonic**0.3
    envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 0.5
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return ((0.25 * voice / np.abs(voice).max() + 0.01 * noise) * envelope).astype(np.float32)


def encode(spec: AudioFormatSpec, samples: np.ndarray, options: dict[str, str]) -> tuple[float, bytes]:
    """(CPU seconds of this thread, file) for mono `samples` at the speech rate, fed in stream-sized chunks."""
    sink = io.BytesIO()
    container = av.open(sink, "w", format=spec.container)
    stream = container.add_stream(spec.codec, rate=spec.codec_rate_hz(SPEECH_RATE_HZ), layout="mono")
    stream.codec_context.options = options
    started, offset = time.thread_time(), 0
    for chunk in np.array_split(samples, CHUNKS):
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate, frame.pts = SPEECH_RATE_HZ, offset
        offset += len(chunk)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    return time.thread_time() - started, sink.getvalue()


def decode(data: bytes, container: str) -> np.ndarray:
    """Mono float64 samples of an encoded file at the speech rate (opus decodes at 48 kHz: resampled back)."""
    resampler = av.AudioResampler(format="dbl", layout="mono", rate=SPEECH_RATE_HZ)
    with av.open(io.BytesIO(data), format=container) as file:
        frames = [out for frame in file.decode(audio=0) for out in resampler.resample(frame)]
    frames += resampler.resample(None)
    return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames])


def closeness(reference: np.ndarray, decoded: np.ndarray) -> dict:
    """Log-spectral distance (dB, 0-8 kHz, frames with sound) and SNR (dB) of `decoded` against `reference`, both at
    the speech rate, after shifting `decoded` by the codec delay that best lines them up."""
    length = len(reference) - MAX_DELAY_SAMPLES
    reference = reference[:length].astype(np.float64)
    decoded = np.pad(decoded, (0, max(0, length + MAX_DELAY_SAMPLES - len(decoded))))
    size = 2 * (length + MAX_DELAY_SAMPLES)
    # correlation[k] = sum over i of decoded[i + k] * reference[i]
    correlation = np.fft.irfft(np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size)), size)
    delay = int(np.argmax(correlation[:MAX_DELAY_SAMPLES]))
    decoded = decoded[delay : delay + length]

    def power(signal: np.ndarray) -> np.ndarray:
        frames = np.lib.stride_tricks.sliding_window_view(signal, 512)[::256] * np.hanning(512)
        return np.abs(np.fft.rfft(frames))[:, : 512 * BAND_HZ // SPEECH_RATE_HZ + 1] ** 2

    ours, theirs = power(reference), power(decoded)
    sounding = ours.sum(axis=1) > ours.sum(axis=1).max() * 1e-3
    floor = ours.max() * 1e-6
    ratio_db = 10 * np.log10((ours[sounding] + floor) / (theirs[sounding] + floor))
    error = reference - decoded
    return {
        "lsd_db": round(float(np.mean(np.sqrt(np.mean(ratio_db**2, axis=1)))), 2),
        "snr_db": round(float(10 * np.log10(np.sum(reference**2) / max(np.sum(error**2), 1e-20))), 2),
        "delay_samples": delay,
    }


def measure(spec: AudioFormatSpec, samples: np.ndarray, options: dict[str, str], repeats: int) -> dict:
    cpu_s, data = min(encode(spec, samples, options) for _ in range(repeats))
    decoded = decode(data, spec.container)
    audio_s = len(samples) / SPEECH_RATE_HZ
    return {"options": options, "cpu_ms_per_audio_s": round(cpu_s * 1000 / audio_s, 2), "bytes": len(data)} | (
        closeness(samples, decoded)
    )


def silence_cost(spec: AudioFormatSpec, seconds: float, repeats: int) -> dict:
    """CPU ms per audio second of `seconds` of silence with the gateway's options, on an encoder thread and here."""
    silence, options = np.zeros(int(seconds * SPEECH_RATE_HZ), np.float32), dict(spec.codec_options)
    threads = EncoderThreads(1)
    try:
        flushed_s = min(threads.submit(encode, spec, silence, options).result()[0] for _ in range(repeats))
    finally:
        threads.shutdown()
    kept_s = min(encode(spec, silence, options)[0] for _ in range(repeats))
    return {
        "format": spec.name,
        "flushed_cpu_ms_per_audio_s": round(flushed_s * 1000 / seconds, 2),
        "not_flushed_cpu_ms_per_audio_s": round(kept_s * 1000 / seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chorus.bench.encoders", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="encodes per setting; the fastest counts")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    samples = speech_like(args.seconds)
    results = []
    for spec in (spec for spec in FORMATS.values() if spec.codec_options):
        row = {
            "format": spec.name,
            "codec": spec.codec,
            "defaults": measure(spec, samples, {}, args.repeats),
            "chosen": measure(spec, samples, dict(spec.codec_options), args.repeats),
        }
        print(json.dumps(row), file=sys.stderr, flush=True)
        results.append(row)
    silence = [silence_cost(FORMATS[name], args.seconds, args.repeats) for name in ("mp3", "opus", "aac")]
    print(json.dumps({"silence": silence}), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"encoders-{time.strftime('%Y%m%d-%H%M%S')}.json"
    settings = {"seconds": args.seconds, "rate_hz": SPEECH_RATE_HZ, "chunks": CHUNKS, "repeats": args.repeats}
    report = {"benchmark": "encoders", "commit": commit(), "host": platform.node(), "cpu": platform.processor(),
              "settings": settings, "results": results, "silence": silence}  # fmt: skip
    path.write_text(json.dumps(report, indent=2))
    pairs = [(row["chosen"]["cpu_ms_per_audio_s"], row["defaults"]["cpu_ms_per_audio_s"]) for row in results]
    pairs += [(row["flushed_cpu_ms_per_audio_s"], row["not_flushed_cpu_ms_per_audio_s"]) for row in silence]
    write_grouped_bars(path.with_suffix(".png"), pairs)
    print(f"wrote {path} and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
