"""The response formats of the OpenAI speech API and how each is produced."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class AudioFormatSpec:
    name: str
    content_type: str
    container: str | None  # PyAV muxer; None for the formats written by hand (pcm, wav)
    codec: str | None
    codec_rates_hz: tuple[int, ...] = ()  # rates the codec accepts; empty means any
    container_options: tuple[tuple[str, str], ...] = ()
    codec_options: tuple[tuple[str, str], ...] = ()  # FFmpeg options of the codec (`python -m chorus.bench.encoders`)

    @property
    def is_s16_pcm(self) -> bool:
        """Whether the file holds the samples themselves as 16-bit PCM (pcm, wav): int16 input is written as is."""
        return self.container is None

    def codec_rate_hz(self, sample_rate_hz: int) -> int:
        """The rate the codec runs at for input at `sample_rate_hz` (PyAV resamples on the way in)."""
        if not self.codec_rates_hz or sample_rate_hz in self.codec_rates_hz:
            return sample_rate_hz
        return max(self.codec_rates_hz)


FORMATS: dict[str, AudioFormatSpec] = {
    spec.name: spec
    for spec in (
        # Encoding is most of a gateway worker's time for mp3, opus and aac streams. LAME's quality 7 and FFmpeg's fast
        # AAC coder take 0.57x and 0.18x the CPU of their defaults (quality 3, two-loop search) for speech-like audio,
        # which they keep as well or better (same bitrate; spectral distance and SNR in `chorus.bench.encoders`).
        AudioFormatSpec("mp3", "audio/mpeg", "mp3", "libmp3lame", codec_options=(("compression_level", "7"),)),
        # Ogg pages are flushed every 100 ms instead of every second, so the first audio leaves early. libopus at
        # complexity 6 instead of 10 takes 0.8x the CPU and keeps speech-like audio as close (0.03 dB of spectral
        # distance); below 5 it starts to lose it.
        AudioFormatSpec(
            "opus",
            "audio/ogg",
            "ogg",
            "libopus",
            codec_rates_hz=(8000, 12000, 16000, 24000, 48000),
            container_options=(("page_duration", "100000"),),
            codec_options=(("compression_level", "6"),),
        ),
        AudioFormatSpec("aac", "audio/aac", "adts", "aac", codec_options=(("aac_coder", "fast"),)),
        AudioFormatSpec("flac", "audio/flac", "flac", "flac"),
        AudioFormatSpec("wav", "audio/wav", None, None),
        AudioFormatSpec("pcm", "audio/pcm", None, None),
    )
}
