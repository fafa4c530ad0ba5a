"""Incremental encoding: PCM chunks in, encoded bytes out as soon as the codec yields them.

The concatenation of every `encode` result and the final `flush` is one valid file. `encode_async` and
`flush_async` run a codec (or the tempo filter) in a worker thread (the gateway's `encoder_threads`): PyAV
releases the GIL while it encodes, so a gateway process spreads its streams' mp3/opus work over its share of the
machine's cores and its event loop keeps serving the others meanwhile. Containers
are written to a non-seekable sink, so muxers that would go back to patch a header (mp3's Xing
frame, FLAC's STREAMINFO totals) leave it as "unknown length", which every decoder accepts.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from concurrent.futures import Executor

import av
import numpy as np

from chorus.gateway.audio.encoder_threads import EncoderThreads
from chorus.gateway.audio.formats import FORMATS
from chorus.gateway.audio.tempo import TempoFilter

_LAYOUTS = {1: "mono", 2: "stereo"}
# A streaming WAV header does not know the data length: RIFF and data sizes are 0xFFFFFFFF,
# which decoders read as "until the end of the stream" (what OpenAI-compatible servers send).
_UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate_hz: int, num_channels: int) -> bytes:
    """A 44-byte PCM s16le WAV header for a stream of unknown length."""
    bytes_per_frame = 2 * num_channels
    byte_rate = sample_rate_hz * bytes_per_frame
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, num_channels, sample_rate_hz, byte_rate, bytes_per_frame, 16)
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


class _ByteSink:
    """A write-only file for PyAV; no seek, so muxers stream instead of patching headers."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class StreamingEncoder:
    """Encodes one audio stream to `format_name` (mp3, opus, aac, flac, wav, pcm).

    Input chunks are numpy arrays of shape (num_samples,) for mono or (num_samples, num_channels),
    float (in [-1, 1]) or int16, at `sample_rate_hz`. `speed` (0.25–4.0) changes tempo, not pitch.
    Opus runs at 48 kHz when the input rate is not one libopus accepts (e.g. 44.1 kHz). The async methods encode
    on `threads` (None: the event loop's default executor).
    """

    def __init__(
        self,
        format_name: str,
        sample_rate_hz: int,
        num_channels: int = 1,
        speed: float = 1.0,
        threads: Executor | None = None,
    ) -> None:
        if format_name not in FORMATS:
            raise ValueError(f"response_format: must be one of {', '.join(FORMATS)}, got {format_name!r}")
        if num_channels not in _LAYOUTS:
            raise ValueError(f"num_channels: must be 1 or 2, got {num_channels}")
        if sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz: must be positive, got {sample_rate_hz}")
        self.spec = FORMATS[format_name]
        self.sample_rate_hz = sample_rate_hz
        self.num_channels = num_channels
        self._layout = _LAYOUTS[num_channels]
        self._tempo = TempoFilter(speed, sample_rate_hz, self._layout) if speed != 1.0 else None
        self._threads = threads
        self._num_samples_in = 0
        self._is_finished = False
        self._has_sent_header = False
        self._sink = _ByteSink()
        # encode/flush may run in a worker thread while the event loop closes a cancelled stream.
        self._lock = threading.Lock()
        self._container = None
        self._stream = None
        if self.spec.container is not None:
            self._container = av.open(
                self._sink,
                "w",
                format=self.spec.container,
                container_options={"flush_packets": "1", **dict(self.spec.container_options)},
            )
            self._stream = self._container.add_stream(
                self.spec.codec, rate=self.spec.codec_rate_hz(sample_rate_hz), layout=self._layout
            )
            self._stream.codec_context.options = dict(self.spec.codec_options)  # read when the codec opens

    @property
    def content_type(self) -> str:
        return self.spec.content_type

    def encode(self, samples: np.ndarray) -> bytes:
        """Feeds one chunk; returns whatever encoded bytes are ready (possibly none yet)."""
        with self._lock:
            assert not self._is_finished, "encode after flush"
            samples = self._checked(samples)
            if self._is_plain_pcm:  # a sample conversion: no PyAV frame to build and read back
                return self._wav_header_once() + _s16le(samples)
            frame = self._to_frame(samples)
            frames = self._tempo.process(frame) if self._tempo is not None else [frame]
            return self._write(frames)

    def flush(self) -> bytes:
        """Ends the stream; returns the last bytes (codec tail, container trailer)."""
        with self._lock:
            assert not self._is_finished, "flush twice"
            frames = self._tempo.process(None) if self._tempo is not None else []
            data = self._write(frames)
            self._is_finished = True
            if self._container is not None:
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
                self._container.close()
                data += self._sink.take()
            return data

    async def encode_async(self, samples: np.ndarray, order: tuple | None = None) -> bytes:
        """`encode`, in a worker thread unless the format is plain PCM (pcm, wav at speed 1); `order`: its place
        among the other encodes waiting for `EncoderThreads` (`stream_order`; None: as submitted)."""
        return await self._off_the_loop(order, self.encode, samples)

    async def flush_async(self, order: tuple | None = None) -> bytes:
        """`flush`, in a worker thread unless the format is plain PCM."""
        return await self._off_the_loop(order, self.flush)

    async def _off_the_loop(self, order: tuple | None, method, *args) -> bytes:
        if self._is_plain_pcm:
            return method(*args)
        if order is not None and isinstance(self._threads, EncoderThreads):
            return await asyncio.wrap_future(self._threads.submit_ordered(order, method, *args))
        return await asyncio.get_running_loop().run_in_executor(self._threads, method, *args)

    def close(self) -> None:
        """Releases the codec without finishing the file (the request was cancelled); waits for an encode
        still running in a worker thread (at most one chunk's)."""
        with self._lock:
            self._is_finished = True
            if self._container is not None:
                self._container.close()

    @property
    def _is_plain_pcm(self) -> bool:
        """Whether encoding is only a sample conversion (microseconds a chunk): not worth a thread hop."""
        return self._container is None and self._tempo is None

    def _checked(self, samples: np.ndarray) -> np.ndarray:
        """`samples` as `(num_samples, num_channels)`, int16 or float32."""
        samples = np.asarray(samples)
        if samples.ndim == 1:
            samples = samples[:, None]
        if samples.ndim != 2 or samples.shape[1] != self.num_channels:
            raise ValueError(f"samples: expected shape (num_samples, {self.num_channels}), got {samples.shape}")
        if samples.dtype == np.int16:
            return samples
        if np.issubdtype(samples.dtype, np.floating):
            return samples.astype(np.float32, copy=False)
        raise ValueError(f"samples: expected float or int16, got {samples.dtype}")

    def _to_frame(self, samples: np.ndarray) -> av.AudioFrame:
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        interleaved = np.ascontiguousarray(samples.reshape(1, -1))
        frame = av.AudioFrame.from_ndarray(interleaved, format="flt", layout=self._layout)
        frame.sample_rate = self.sample_rate_hz
        frame.pts = self._num_samples_in
        self._num_samples_in += samples.shape[0]
        return frame

    def _write(self, frames: list[av.AudioFrame]) -> bytes:
        if self._container is None:
            return self._write_raw(frames)
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def _write_raw(self, frames: list[av.AudioFrame]) -> bytes:
        return self._wav_header_once() + b"".join(_s16le(frame.to_ndarray()) for frame in frames)

    def _wav_header_once(self) -> bytes:
        if self.spec.name != "wav" or self._has_sent_header:
            return b""
        self._has_sent_header = True
        return wav_header(self.sample_rate_hz, self.num_channels)


def _s16le(samples: np.ndarray) -> bytes:
    """Samples (int16, or float32 in [-1, 1]), interleaved, as s16le bytes; int16 unchanged."""
    if samples.dtype == np.int16:
        return samples.astype("<i2", copy=False).tobytes()
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()
