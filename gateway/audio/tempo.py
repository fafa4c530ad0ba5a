"""Speed change without pitch change (the OpenAI `speed` field), streamed through FFmpeg's atempo."""

from __future__ import annotations

import av
import av.filter

MIN_SPEED = 0.25
MAX_SPEED = 4.0
# One atempo instance accepts 0.5–2.0 with the best quality; larger changes chain several.
_ATEMPO_MIN = 0.5
_ATEMPO_MAX = 2.0


def atempo_factors(speed: float) -> list[float]:
    """Factors within atempo's best range whose product is `speed`."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed: must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
    factors = []
    while speed > _ATEMPO_MAX:
        factors.append(_ATEMPO_MAX)
        speed /= _ATEMPO_MAX
    while speed < _ATEMPO_MIN:
        factors.append(_ATEMPO_MIN)
        speed /= _ATEMPO_MIN
    factors.append(speed)
    return factors


class TempoFilter:
    """Frames in, tempo-changed frames out, as soon as the filter has them; `flush` drains the tail."""

    def __init__(self, speed: float, sample_rate_hz: int, layout: str, sample_format: str = "flt") -> None:
        self._graph = av.filter.Graph()
        source = self._graph.add_abuffer(
            format=sample_format, sample_rate=sample_rate_hz, layout=layout, time_base=f"1/{sample_rate_hz}"
        )
        node = source
        for factor in atempo_factors(speed):
            tempo = self._graph.add("atempo", f"{factor:.6f}")
            node.link_to(tempo)
            node = tempo
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()

    def process(self, frame: av.AudioFrame | None) -> list[av.AudioFrame]:
        """Pushes `frame` (None = end of input) and returns every frame the filter can give now."""
        self._graph.push(frame)
        frames = []
        while True:
            try:
                frames.append(self._graph.pull())
            except (av.BlockingIOError, av.EOFError):
                return frames
