"""Vocoder test fixtures: the tiny codec and its checkpoint in the official layout."""

from __future__ import annotations

import pytest

from chorus.vocoder.loader import TINY_CONFIG, TINY_SEED, build_random_codec, save_official


@pytest.fixture(scope="session")
def tiny_codec():
    codec = build_random_codec(TINY_CONFIG, TINY_SEED)
    codec.decoder.eval()
    codec.encoder.eval()
    return codec


@pytest.fixture(scope="session")
def tiny_folder(tiny_codec, tmp_path_factory):
    """The tiny codec written as an official `speech_tokenizer/` folder."""
    return save_official(tiny_codec, tmp_path_factory.mktemp("codec") / "speech_tokenizer")
