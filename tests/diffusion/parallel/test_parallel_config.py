"""Parallel modes and degrees the model or the config cannot run are refused, naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.dit import ATTENTION_BACKENDS, COMPILE_MODES
from chorus.diffusion.parallel.plan import ParallelConfigError, ParallelPlan, make_plan
from chorus.runtime.config import load_config

RELEASED_HEADS = {"num_heads": 24, "num_kv_heads": 12}


@pytest.mark.parametrize(
    ("parallel", "degree", "plan"),
    [
        ("none", 2, ParallelPlan(1, 1, 1)),
        ("cfg", 2, ParallelPlan(2, 1, 1)),
        ("tp", 4, ParallelPlan(1, 4, 1)),
        ("sp", 2, ParallelPlan(1, 1, 2)),
        ("cfg+tp", 4, ParallelPlan(2, 2, 1)),
        ("cfg+sp", 8, ParallelPlan(2, 1, 4)),
    ],
)
def test_plans_of_the_released_model(parallel: str, degree: int, plan: ParallelPlan) -> None:
    assert make_plan(parallel, degree, **RELEASED_HEADS) == plan


@pytest.mark.parametrize(
    ("parallel", "degree", "message"),
    [
        ("tp", 5, "must divide the DiT's 24 attention heads and 12 KV heads"),
        ("sp", 8, "must divide"),  # divides 24 heads but not 12 KV heads
        ("cfg+tp", 3, "even degree"),
        ("cfg+tp", 2, "at least 4"),
        ("tp", 1, "at least 2"),
        ("ring", 2, "parallel: expected one of"),
    ],
)
def test_bad_degrees_are_config_errors(parallel: str, degree: int, message: str) -> None:
    with pytest.raises(ParallelConfigError, match=r"^parallel") as failure:
        make_plan(parallel, degree, **RELEASED_HEADS)
    assert message in str(failure.value)


def test_config_choices_are_what_the_denoiser_accepts() -> None:
    fields = {f.name: f.metadata["choices"] for f in dataclasses.fields(DiffusionConfig)}
    assert set(fields["attention_backend"]) == set(ATTENTION_BACKENDS)
    assert set(fields["compile_mode"]) == set(COMPILE_MODES)


def test_parallel_settings_come_from_the_environment() -> None:
    environ = {"CHORUS_DIFFUSION_PARALLEL": "cfg+tp", "CHORUS_DIFFUSION_PARALLEL_DEGREE": "4"}
    config = load_config(DiffusionConfig, environ=environ)
    assert (config.parallel, config.parallel_degree) == ("cfg+tp", 4)
    with pytest.raises(ValueError, match="CHORUS_DIFFUSION_PARALLEL"):
        load_config(DiffusionConfig, environ={"CHORUS_DIFFUSION_PARALLEL": "pp"})
