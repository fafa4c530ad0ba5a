"""The one-sort warp equals transformers' temperature → top-k → top-p processors (what the reference applies)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from chorus.talker.sampling import FAST_TOP_K, RowParams, SamplingParams, choose, open_uniform, sample_code0, warp


@pytest.mark.parametrize("seed", range(3))
def test_warp_matches_the_reference_processors_row_by_row(seed):
    generator = torch.Generator().manual_seed(seed)
    rows = [(0.9, 50, 1.0), (0.7, 0, 0.8), (1.3, 10, 0.5), (1.0, 2048, 0.95), (0.5, 1, 1.0), (1.0, 0, 1.0)]
    scores = torch.randn(len(rows), 2048, generator=generator) * 3
    params = RowParams(
        do_sample=torch.ones(len(rows), dtype=torch.bool),
        temperature=torch.tensor([row[0] for row in rows]),
        top_k=torch.tensor([row[1] for row in rows]),
        top_p=torch.tensor([row[2] for row in rows]),
        seed=torch.zeros(len(rows), dtype=torch.long),
    )
    ours = warp(scores, params)
    for index, (temperature, top_k, top_p) in enumerate(rows):
        expected = TemperatureLogitsWarper(temperature)(None, scores[index : index + 1])
        if top_k > 0:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1.0:
            expected = TopPLogitsWarper(top_p)(None, expected)
        torch.testing.assert_close(ours[index : index + 1], expected, rtol=0, atol=0)


def _selectable_rows(count: int, generator: torch.Generator) -> RowParams:
    return RowParams(
        do_sample=torch.rand(count, generator=generator) < 0.8,
        temperature=0.5 + torch.rand(count, generator=generator),
        top_k=torch.randint(1, FAST_TOP_K + 1, (count,), generator=generator),
        top_p=torch.ones(count),
        seed=torch.randint(0, 2**40, (count,), generator=generator),
    )


@pytest.mark.parametrize("seed", range(3))
def test_selecting_the_kth_score_keeps_what_the_sort_keeps(seed):
    generator = torch.Generator().manual_seed(seed)
    params = _selectable_rows(64, generator)
    # bf16-rounded logits: many ties, which top-k keeps on both paths; a banned id is -inf on both.
    scores = (torch.randn(64, 2048, generator=generator) * 4).bfloat16().float()
    scores[:, 7] = float("-inf")
    sorted_warp, selected_warp = warp(scores, params), warp(scores, params, FAST_TOP_K)
    assert torch.equal(sorted_warp, selected_warp)
    assert (sorted_warp[params.do_sample] > float("-inf")).sum(-1).ge(params.top_k[params.do_sample]).all()


def test_ids_past_float32_underflow_are_kept_by_selection_yet_never_drawn():
    # Scores spread over thousands: in-top-k ids whose probability underflows to 0 are dropped by top-p's `mass > 0`
    # on the sorting path, kept by selection; the draws must agree anyway.
    generator = torch.Generator().manual_seed(3)
    params = _selectable_rows(256, generator)
    params.do_sample.fill_(True)
    scores = torch.randn(256, 2048, generator=generator) * 300
    sorted_warp, selected_warp = warp(scores, params), warp(scores, params, FAST_TOP_K)
    assert not torch.equal(sorted_warp, selected_warp), "the case this test is about occurs"
    frame = torch.arange(256)
    for codebook in range(16):
        assert torch.equal(choose(sorted_warp, params, frame, codebook), choose(selected_warp, params, frame, codebook))


def test_which_requests_the_selecting_sampler_serves():
    assert SamplingParams().selects_top_k(), "the released defaults"
    assert SamplingParams(do_sample=False, subtalker_do_sample=False, top_k=0, top_p=0.5).selects_top_k(), "greedy"
    assert not SamplingParams(top_p=0.9).selects_top_k()
    assert not SamplingParams(subtalker_top_k=0).selects_top_k()
    assert not SamplingParams(top_k=FAST_TOP_K + 1).selects_top_k()


def test_greedy_rows_pass_through():
    scores = torch.randn(2, 64)
    params = RowParams(
        torch.tensor([False, True]), torch.tensor([1.0, 0.5]), torch.tensor([5, 5]), torch.tensor([0.5, 0.5]),
        torch.zeros(2, dtype=torch.long),
    )  # fmt: skip
    warped = warp(scores, params)
    assert torch.equal(warped[0], scores[0])
    assert torch.isinf(warped[1]).sum() >= 64 - 5, "the sampling row is filtered"


def test_uniforms_stay_inside_the_open_interval_so_gumbel_noise_is_finite():
    # The extreme hashes once gave u == 1.0: infinite noise, NaN on a suppressed id's -inf score, a control id drawn.
    hashed = torch.tensor([0, 1, 511, 512, 0xFFFFFF00, 0xFFFFFFFE, 0xFFFFFFFF], dtype=torch.int64)
    uniform = open_uniform(hashed)
    assert (uniform > 0).all() and (uniform < 1).all()
    assert torch.isfinite(-torch.log(-torch.log(uniform))).all()


def test_a_suppressed_id_is_not_drawn_where_its_hash_is_the_largest():
    # Seed 175, frame 16: id 2915 (a control id) hashes to the top 24-bit value; it used to be drawn.
    vocab, eos, first_control = 3072, 2150, 2048
    params = RowParams(
        do_sample=torch.ones(1, dtype=torch.bool),
        temperature=torch.full((1,), 0.9),
        top_k=torch.full((1,), 50),
        top_p=torch.ones(1),
        seed=torch.tensor([175]),
    )
    ids = sample_code0(
        torch.randn(1, vocab),
        torch.zeros(1, vocab, dtype=torch.bool),
        torch.tensor([16]),
        torch.tensor([1.05]),
        torch.tensor([1 << 62]),
        params,
        eos,
        first_control,
    )
    assert ids.item() < first_control
