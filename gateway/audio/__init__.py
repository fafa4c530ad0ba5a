"""Incremental audio encoders for the gateway's responses."""

from chorus.gateway.audio.encoder import StreamingEncoder
from chorus.gateway.audio.formats import FORMATS, AudioFormatSpec

__all__ = ["FORMATS", "AudioFormatSpec", "StreamingEncoder"]
