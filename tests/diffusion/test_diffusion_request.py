"""Request validation: every bad parameter raises a ValueError subclass naming its field."""

from __future__ import annotations

import math

import pytest

from chorus.diffusion.engine.request import InvalidGenerationParameter, RequestLimits, validate_request
from chorus.runtime.errors import InvalidRequest

LIMITS = RequestLimits(max_duration_s=47.55, max_num_outputs=8)

BAD = [
    ("prompt", {"prompt": ""}),
    ("prompt", {"prompt": "   "}),
    ("prompt", {"prompt": "x" * 4097}),
    ("negative_prompt", {"negative_prompt": "x" * 4097}),
    ("duration_s", {"duration_s": -1.0}),
    ("duration_s", {"duration_s": 47.6}),
    ("duration_s", {"duration_s": math.nan}),
    ("start_s", {"start_s": -0.5}),
    ("start_s", {"start_s": 40.0, "duration_s": 10.0}),
    ("num_steps", {"num_steps": 1001}),
    ("num_steps", {"num_steps": -3}),
    ("guidance_scale", {"guidance_scale": -1.0}),
    ("guidance_scale", {"guidance_scale": 51.0}),
    ("guidance_scale", {"guidance_scale": math.inf}),
    ("seed", {"seed": -1}),
    ("seed", {"seed": 2**64}),
    ("num_outputs", {"num_outputs": 9}),
]


@pytest.mark.parametrize(("field", "params"), BAD, ids=[f"{f}={p}" for f, p in BAD])
def test_bad_parameters_name_their_field(field, params):
    with pytest.raises(InvalidGenerationParameter) as raised:
        validate_request(LIMITS, request_id="r", **{"prompt": "rain", **params})
    assert raised.value.field == field and str(raised.value).startswith(field)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, InvalidRequest)


def test_defaults_follow_the_wire_contract():
    request = validate_request(LIMITS, request_id="r", prompt="rain", negative_prompt="")
    assert request.duration_s == 10.0 and request.start_s == 0.0
    assert request.num_steps == 100 and request.guidance_scale == 7.0 and request.num_outputs == 1
    assert request.negative_prompt is None and 0 <= request.seed < 2**64
    assert validate_request(LIMITS, request_id="", prompt="x").request_id != ""
    assert validate_request(LIMITS, request_id="r", prompt="x", duration_s=47.55, num_steps=1).duration_s == 47.55
    assert validate_request(RequestLimits(0.74, 2), request_id="r", prompt="x").duration_s == 0.74


def test_output_seeds_are_consecutive_and_wrap():
    request = validate_request(LIMITS, request_id="r", prompt="x", seed=2**64 - 1, num_outputs=2)
    assert [request.output_seed(i) for i in range(2)] == [2**64 - 1, 0]
