"""Talker test fixtures: the tiny talker written as an official checkpoint folder, and engines on it."""

from __future__ import annotations

import pytest

from chorus.talker.loader import TINY_CONFIG, TINY_SEED, build_random, load_checkpoint, save_official


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    return save_official(build_random(TINY_CONFIG, TINY_SEED), tmp_path_factory.mktemp("talker") / "checkpoint")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_folder):
    return load_checkpoint(tiny_folder)
