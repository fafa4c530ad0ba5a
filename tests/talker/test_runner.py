"""Runner invariants the CUDA-graph path relies on, checked on CPU: a decode step with every row inactive (what
graph warm-up and capture execute) changes no request's state or later output."""

from __future__ import annotations

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from chorus.talker.engine.runner import TalkerRunner, batch_bucket, positions_for_memory
from chorus.talker.prompt import VoiceRequest, build_prompt
from chorus.talker.sampling import SamplingParams


def _prefilled_runner(loaded) -> TalkerRunner:
    runner = TalkerRunner(loaded.model, num_slots=2, max_positions=64)
    for slot, speaker in enumerate(("ryan", "vivian")):
        voice = VoiceRequest("custom_voice", [151644, 77091, 198], [11, 12, 13, 14], speaker=speaker)
        runner.set_params([slot], [SamplingParams(seed=slot)], seeds=[slot], ignore_eos=[False])
        assert runner.kv_blocks.grow(slot, 64)  # every position of the slot's one block
        runner.prefill([slot], *runner.embed_prompts([build_prompt(loaded.config, voice)], [voice]))
    return runner


def _decode_frames(runner: TalkerRunner, num_steps: int) -> list[torch.Tensor]:
    frames = []
    for _ in range(num_steps):
        position = int(runner.position[:2].max())
        step_frames, _ = runner.decode([0, 1], [151671, 151671], position)
        frames.append(step_frames)
    return frames


def test_inactive_decode_steps_leave_requests_untouched(tiny_loaded):
    reference = _decode_frames(_prefilled_runner(tiny_loaded), 4)
    runner = _prefilled_runner(tiny_loaded)
    state = [t.clone() for t in (runner.last_hidden, runner.next_code0, runner.position, runner.num_generated,
                                 runner.generated_mask)]  # fmt: skip
    runner.active.zero_()
    with torch.inference_mode():
        for _ in range(2):
            runner.decode_compute(2, 64)
    after = (runner.last_hidden, runner.next_code0, runner.position, runner.num_generated, runner.generated_mask)
    assert all(torch.equal(before, now) for before, now in zip(state, after, strict=True))
    for expected, got in zip(reference, _decode_frames(runner, 4), strict=True):
        assert np.array_equal(expected, got)


class _InferenceModeCalls(TorchFunctionMode):
    """Records the torch calls made while inference mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.is_inference_mode_enabled():
            self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def test_the_runner_works_outside_inference_mode(tiny_loaded):
    # Compiled code is specialised on its inputs' dispatch keys: tensors made in inference mode next to the runner's
    # buffers compiled each CUDA shape class twice (the figures are in runner._compile's comment).
    with _InferenceModeCalls() as calls:
        runner = _prefilled_runner(tiny_loaded)
        _decode_frames(runner, 2)
        runner.warmup()
    assert calls.names == []


def test_bucket_and_capacity_arithmetic():
    assert [batch_bucket(n, 64) for n in (1, 3, 9, 17, 64)] == [1, 4, 16, 32, 64]
    assert batch_bucket(70, 70) == 70 and batch_bucket(5, 6) == 6
    # 0.6B-sized KV: 112 KiB per position; half of 10 GiB holds 46811 positions, 46784 in whole blocks of 64.
    assert positions_for_memory(10 * 2**30, 0.5, 112 * 1024) == 46784
