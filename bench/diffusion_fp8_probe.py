"""`python bench/diffusion_fp8_probe.py` on an H100: would FP8 GEMMs speed the DiT up within the parity tolerance?

An experiment kept for its answer, not a serving path. It builds the released-shape DiT (dummy weights) three
ways: fp32 eager (the stand-in for the reference), the serving default (fp16, compiled blocks, CUDA graphs) and
the same with every block linear layer run as an FP8 e4m3 GEMM (`torch._scaled_mm`, per-row activation and
per-channel weight scales). It times one DiT forward at 2 and 16 rows (1 and 8 samples with CFG) and a whole
100-step, 10 s sample, and compares each sample with the fp32 one: the half-precision parity tolerance of
tests/diffusion (rtol 2e-2, atol 2e-2 × max), and the log-spectral distance in dB. Writes
`bench/results/diffusion-fp8-<stamp>.json` and beside it a bar chart of the DiT time of 100 steps (s), fp16 then
FP8, at 1 and at 8 samples.

On an H100 at 30e6111 (bench/results/diffusion-fp8-20261125-100433, from this script's first form: the same
builds and measures): fp16 10.5 / 77.8 ms per forward at 2 / 16 rows, FP8 9.6 / 64.2 ms; the FP8 sample is off
the fp32 one by 3.8 % of its peak (tolerance 2 %; fp16: 0.15 %) and 1.55 dB log-spectral distance (fp16: 0.10).
So FP8 is not the default, and for 9–17 % it is not offered as an opt-in either.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from chorus.bench.report import REPO, commit
from chorus.diffusion.bench_plot import write_bar_chart
from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.graphs import GraphedDenoiser
from chorus.diffusion.loader import load_models

E4M3_MAX = 448.0
# Unused by the fused attention: its self-attention Q/K/V and cross-attention K/V are views of fused weights.
UNFUSED = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_k", "attn2.to_v", "attn2.to_kv"}
SPEC = SampleSpec("rain on a tin roof", None, 0.0, 10.0, 7.0, 100, 1234)


class Fp8Linear(nn.Module):
    """A linear layer as an FP8 GEMM: weights quantised once per output channel, activations per row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
        self.register_buffer("weight", (weight / scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.t().contiguous())
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.out_dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        quantised = (rows.float() / scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            quantised, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=torch.bfloat16
        ).to(self.out_dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], -1)


def to_fp8(transformer: nn.Module) -> int:
    """Swaps every block linear layer the fused attention uses for an Fp8Linear; returns how many."""
    count = 0
    for block in transformer.transformer_blocks:
        for name, module in list(block.named_modules()):
            if isinstance(module, nn.Linear) and name not in UNFUSED:
                parent_name, _, child = name.rpartition(".")
                setattr(block.get_submodule(parent_name) if parent_name else block, child, Fp8Linear(module))
                count += 1
    return count


def build(dtype: str, fp8: bool = False, serving: bool = True):
    models = load_models("dummy", load_format="dummy", device="cuda", dtype=dtype, vae_dtype="float32", seed=0)
    denoiser = StableAudioDenoiser(
        models.transformer, models.time_frequencies, compile_blocks=serving, attention_backend="cudnn"
    )
    if fp8:
        to_fp8(models.transformer)
    return models, GraphedDenoiser.captured(denoiser, models, 16) if serving else denoiser


@torch.inference_mode()
def forward_ms(models, denoiser, rows: int, repeats: int = 30) -> float:
    config = models.transformer.config
    inputs = (
        torch.randn(rows, models.num_latent_channels, models.num_latent_frames, device="cuda"),
        torch.rand(rows, device="cuda"),
        torch.randn(rows, 130, config.cross_attention_input_dim, device="cuda"),
        torch.randn(rows, 1, config.global_states_input_dim, device="cuda"),
    )
    for _ in range(3):
        denoiser(*inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        denoiser(*inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def sample(models, denoiser) -> tuple[torch.Tensor, float]:
    torch.cuda.synchronize()
    started = time.perf_counter()
    waveform = DiffusionRunner(models, denoiser=denoiser).generate([SPEC])[0]
    return waveform, time.perf_counter() - started


def compare(ours: torch.Tensor, reference: torch.Tensor) -> dict:
    difference = (ours - reference).abs()
    peak = float(reference.abs().max())
    window = torch.hann_window(2048)

    def magnitude(waveform):
        return torch.stft(waveform, 2048, window=window, return_complex=True).abs() + 1e-6

    log_ratio_db = 20 * torch.log10(magnitude(ours) / magnitude(reference))
    return {
        "max_abs_over_peak": float(difference.max()) / peak,
        "rms_relative": float(difference.pow(2).mean().sqrt() / reference.pow(2).mean().sqrt()),
        "within_half_parity_tolerance": bool((difference <= 2e-2 * reference.abs() + 2e-2 * peak).all()),
        "log_spectral_distance_db": float(log_ratio_db.pow(2).mean().sqrt()),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    models, denoiser = build("float32", serving=False)
    reference, _ = sample(models, denoiser)
    del models, denoiser
    results = {"benchmark": "diffusion-fp8", "commit": commit(), "device": torch.cuda.get_device_name()}
    for name, fp8 in (("float16", False), ("float16+fp8", True)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        models, denoiser = build("float16", fp8=fp8)
        waveform, sample_s = sample(models, denoiser)
        results[name] = {
            "forward_ms_2_rows": forward_ms(models, denoiser, 2),
            "forward_ms_16_rows": forward_ms(models, denoiser, 16),
            "sample_s": sample_s,
            "vs_float32": compare(waveform, reference),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
        print(name, json.dumps(results[name]), flush=True)
        del models, denoiser
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"diffusion-fp8-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    rows = [[(results[name][f"forward_ms_{n}_rows"] / 10, i) for i, name in enumerate(("float16", "float16+fp8"))]
            for n in (2, 16)]  # fmt: skip
    write_bar_chart(path.with_suffix(".png"), rows)
    print(f"wrote {path} and .png")
    return results


if __name__ == "__main__":
    main()
