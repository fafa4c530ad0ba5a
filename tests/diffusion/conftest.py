"""Shared tiny Stable Audio Open build: seeded random weights, CPU, fp32."""

from __future__ import annotations

import pytest

from chorus.diffusion.loader import StableAudioModels, load_models


@pytest.fixture(scope="session")
def tiny_models() -> StableAudioModels:
    return load_models("tiny", device="cpu", dtype="float32", seed=0)
