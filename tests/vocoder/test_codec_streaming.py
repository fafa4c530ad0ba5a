"""Streamed decode equals one-shot decode: per-stream state carries every bit of left context."""

from __future__ import annotations

import random

import pytest
import torch
from vocoder_helpers import random_codes

TOLERANCE = 1e-5


def _one_shot(decoder, codes: torch.Tensor) -> torch.Tensor:
    waveform, _ = decoder(codes, decoder.new_state(codes.shape[0]))
    return waveform


def _streamed(decoder, codes: torch.Tensor, chunk_sizes: list[int]) -> torch.Tensor:
    assert sum(chunk_sizes) == codes.shape[1]
    state, pieces, start = decoder.new_state(1), [], 0
    for size in chunk_sizes:
        piece, state = decoder(codes[:, start : start + size], state)
        assert piece.shape == (1, size * decoder.samples_per_frame)
        pieces.append(piece)
        start += size
    assert state.num_frames.tolist() == [codes.shape[1]]
    return torch.cat(pieces, dim=1)


def _first_then_25(num_frames: int) -> list[int]:
    rest = num_frames - 1
    return [1] + [25] * (rest // 25) + ([rest % 25] if rest % 25 else [])


def _random_sizes(num_frames: int, seed: int) -> list[int]:
    rng, sizes = random.Random(seed), []
    while sum(sizes) < num_frames:
        sizes.append(min(rng.randint(1, 40), num_frames - sum(sizes)))
    return sizes


@pytest.mark.parametrize(
    ("num_frames", "pattern"),
    [
        (120, "first_then_25"),
        (90, "all_1"),
        (150, "random"),
        (420, "first_then_25"),
        (380, "random"),
    ],
)
@torch.inference_mode()
def test_streamed_equals_one_shot(tiny_codec, num_frames, pattern):
    decoder = tiny_codec.decoder
    codes = random_codes(num_frames, seed=num_frames)
    sizes = {
        "first_then_25": _first_then_25(num_frames),
        "all_1": [1] * num_frames,
        "random": _random_sizes(num_frames, seed=num_frames),
    }[pattern]
    expected = _one_shot(decoder, codes)
    assert (expected.abs() < 0.99).float().mean() > 0.9
    assert (_streamed(decoder, codes, sizes) - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("num_context_frames", [0, 25, 72])
@torch.inference_mode()
def test_stateless_windows_are_only_approximate(tiny_codec, num_context_frames):
    """Re-decoding a chunk with N frames of left context and no state (vLLM-Omni's windows; N = 72 there) does
    not give the one-shot samples: the stacked attention windows and conv contexts reach further back."""
    decoder = tiny_codec.decoder
    codes = random_codes(300, seed=3)
    expected = _one_shot(decoder, codes)[:, 200 * 1920 : 225 * 1920]
    window, _ = decoder(codes[:, 200 - num_context_frames : 225], decoder.new_state(1))
    assert (window[:, num_context_frames * 1920 :] - expected).abs().max().item() > 10 * TOLERANCE


@torch.inference_mode()
def test_batched_interleaved_streams_equal_each_alone(tiny_codec):
    """Rows of one batched forward are independent streams at different positions, each with its own state."""
    decoder = tiny_codec.decoder
    lengths = [130, 75, 200, 40]
    streams = [random_codes(n, seed=100 + i) for i, n in enumerate(lengths)]
    pool = decoder.new_state(len(streams) + 1)  # one spare row: batches gather rows out of order
    decoded = [0] * len(streams)
    pieces: list[list[torch.Tensor]] = [[] for _ in streams]
    rng = random.Random(7)
    while any(done < n for done, n in zip(decoded, lengths, strict=True)):
        live = [i for i, n in enumerate(lengths) if decoded[i] < n]
        rows = rng.sample(live, rng.randint(1, len(live)))
        size = min(rng.choice([1, 3, 25, 32]), *(lengths[i] - decoded[i] for i in rows))
        codes = torch.cat([streams[i][:, decoded[i] : decoded[i] + size] for i in rows])
        index = torch.tensor([i + 1 for i in rows])
        waveform, state = decoder(codes, pool.select(index))
        pool.assign(index, state)
        for row, stream in enumerate(rows):
            pieces[stream].append(waveform[row])
            decoded[stream] += size
    for stream, codes in enumerate(streams):
        alone = _one_shot(decoder, codes)[0]
        assert (torch.cat(pieces[stream]) - alone).abs().max().item() <= TOLERANCE


@torch.inference_mode()
def test_context_codes_prime_the_state(tiny_codec):
    """Voice clone: decoding reference + generated frames and cutting the reference part equals priming the
    state with the reference frames (no output kept) and then streaming the generated ones."""
    decoder = tiny_codec.decoder
    reference, generated = random_codes(60, seed=11), random_codes(80, seed=12)
    expected = _one_shot(decoder, torch.cat([reference, generated], dim=1))[:, 60 * 1920 :]
    _, state = decoder(reference, decoder.new_state(1))
    first, state = decoder(generated[:, :1], state)
    rest, _ = decoder(generated[:, 1:], state)
    assert (torch.cat([first, rest], dim=1) - expected).abs().max().item() <= TOLERANCE


@torch.inference_mode()
def test_reset_rows_start_fresh_streams(tiny_codec):
    decoder = tiny_codec.decoder
    pool = decoder.new_state(2)
    rows = torch.tensor([1])
    _, state = decoder(random_codes(30, seed=1), pool.select(rows))
    pool.assign(rows, state)
    pool.reset(rows)
    codes = random_codes(20, seed=2)
    waveform, _ = decoder(codes, pool.select(rows))
    assert torch.equal(waveform, _one_shot(decoder, codes))
