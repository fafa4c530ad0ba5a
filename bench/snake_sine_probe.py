"""`python bench/snake_sine_probe.py [OUT.json]` on a GPU: the vocoder's snake kernel with libdevice's exact sine
against the special-function unit's (`FAST_SIN`, what 16-bit outputs use), with a plain copy of the same tensor as
the memory-bandwidth floor, at the released decoder's last three stages (64 streams × 25 frames, bf16,
channels-last). Also how many output elements the two sines round differently, and by how much. One JSON line a
shape on stdout; all of them in OUT.json if given."""

from __future__ import annotations

import json
import sys

import torch

from chorus.vocoder.models import codec_kernels

SHAPES = ((64, 96, 48_000), (64, 192, 16_000), (64, 384, 4_000))  # (streams, channels, samples)


def milliseconds(launch, reps: int = 50) -> float:
    for _ in range(3):
        launch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def probe(streams: int, channels: int, samples: int) -> dict:
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(streams, samples, channels, device="cuda", generator=generator) * 3
    hidden = hidden.to(torch.bfloat16).transpose(1, 2)  # channels-last, as the fused decoder keeps it
    log_alpha, log_beta, bias = (torch.randn(channels, device="cuda", generator=generator) * 0.5 for _ in range(3))
    grid, tile = codec_kernels._tiling(hidden)
    outputs = {}

    def snake(fast: bool):
        out = outputs.setdefault(fast, codec_kernels.new_activation(hidden))
        arguments = (hidden, bias, log_alpha, log_beta, out, channels, samples, *hidden.stride(), *out.stride())
        return lambda: codec_kernels._snake_kernel[grid](*arguments, HAS_BIAS=True, FAST_SIN=fast, **tile)

    copy = codec_kernels.new_activation(hidden)
    exact_ms, fast_ms = milliseconds(snake(False)), milliseconds(snake(True))
    copy_ms = milliseconds(lambda: copy.copy_(hidden))
    difference = (outputs[True].float() - outputs[False].float()).abs()
    gigabytes = 2 * hidden.numel() * hidden.element_size() / 1e9
    return {
        "shape": [streams, channels, samples],
        "exact_sine_ms": round(exact_ms, 4),
        "fast_sine_ms": round(fast_ms, 4),
        "copy_ms": round(copy_ms, 4),
        "fast_sine_tb_per_s": round(gigabytes / fast_ms, 2),
        "elements_rounded_differently": difference.gt(0).float().mean().item(),
        "largest_difference": difference.max().item(),
    }


def main() -> None:
    rows = []
    for shape in SHAPES:
        rows.append({"device": torch.cuda.get_device_name(), **probe(*shape)})
        print(json.dumps(rows[-1]), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
