"""Probe: DiT step time and 100-step output error of fp16 / bf16 / FP8-rowwise GEMMs vs an fp32 run."""

import json
import sys
import time

import torch
from torch import nn

from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.graphs import GraphedDenoiser
from chorus.diffusion.loader import load_models

E4M3_MAX = 448.0


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
        self.register_buffer("weight_fp8", (w / scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.t().contiguous())
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.out_dtype = linear.weight.dtype

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xs = x2.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        xq = (x2.float() / xs).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=xs, scale_b=self.weight_scale,
                               out_dtype=torch.bfloat16)
        out = out.to(self.out_dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], -1)


SKIP = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_k", "attn2.to_v", "attn2.to_kv"}


def quantize(transformer, skip=SKIP):
    count = 0
    for block in transformer.transformer_blocks:
        for name, module in list(block.named_modules()):
            if isinstance(module, nn.Linear) and name not in skip:
                if module.in_features % 16 or module.out_features % 16:
                    continue
                parent = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
                setattr(parent, name.rsplit(".", 1)[-1], Fp8Linear(module))
                count += 1
    return count


def build(dtype, fp8=False, compile_blocks=True, mode="default", graphs=16):
    models = load_models("dummy", load_format="dummy", device="cuda", dtype=dtype, vae_dtype="float32", seed=0)
    denoiser = StableAudioDenoiser(models.transformer, models.time_frequencies, compile_blocks=compile_blocks,
                                   compile_mode=mode, attention_backend="cudnn")
    n = quantize(models.transformer) if fp8 else 0
    started = time.monotonic()
    wrapped = GraphedDenoiser.captured(denoiser, models, graphs) if graphs else denoiser
    return models, wrapped, n, time.monotonic() - started


@torch.inference_mode()
def step_ms(models, denoiser, rows, repeats=30):
    dev = models.device
    lat = torch.randn(rows, models.num_latent_channels, models.num_latent_frames, device=dev)
    t = torch.rand(rows, device=dev)
    cross = torch.randn(rows, 130, models.transformer.config.cross_attention_input_dim, device=dev)
    glob = torch.randn(rows, 1, models.transformer.config.global_states_input_dim, device=dev)
    for _ in range(3):
        denoiser(lat, t, cross, glob)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        denoiser(lat, t, cross, glob)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


SPEC = SampleSpec("rain on a tin roof", None, 0.0, 10.0, 7.0, 100, 1234)


def generate(models, denoiser):
    runner = DiffusionRunner(models, denoiser=denoiser)
    torch.cuda.synchronize()
    started = time.monotonic()
    out = runner.generate([SPEC])[0]
    return out, time.monotonic() - started


def compare(ours, ref):
    diff = (ours - ref).abs()
    tol = 2e-2 * ref.abs() + 2e-2 * float(ref.abs().max())
    spec_o = torch.stft(ours.reshape(-1, ours.shape[-1]), 2048, return_complex=True, window=torch.hann_window(2048)).abs()
    spec_r = torch.stft(ref.reshape(-1, ref.shape[-1]), 2048, return_complex=True, window=torch.hann_window(2048)).abs()
    return {
        "max_abs": float(diff.max()), "ref_max": float(ref.abs().max()),
        "max_abs_over_ref_max": float(diff.max() / ref.abs().max()),
        "rms_rel": float(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()),
        "passes_half_parity_tolerance": bool((diff <= tol).all()),
        "log_spectral_distance_db": float((20 * torch.log10((spec_o + 1e-6) / (spec_r + 1e-6))).pow(2).mean().sqrt()),
    }


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": mode}
    ref_models, ref_denoiser, _, _ = build("float32", compile_blocks=False, graphs=0)
    ref, ref_s = generate(ref_models, ref_denoiser)
    results["fp32_eager_s"] = ref_s
    del ref_models, ref_denoiser
    torch.cuda.empty_cache()
    variants = [("float16", False), ("float16", True)]
    for dtype, fp8 in variants:
        name = f"{dtype}{'+fp8' if fp8 else ''}"
        try:
            models, denoiser, n, capture_s = build(dtype, fp8=fp8, mode=mode)
            entry = {"fp8_linears": n, "capture_s": capture_s}
            for rows in (2, 16):
                entry[f"step_ms_rows{rows}"] = step_ms(models, denoiser, rows)
            out, gen_s = generate(models, denoiser)
            entry["generate_s"] = gen_s
            entry["vs_fp32"] = compare(out, ref)
            entry["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as exc:  # noqa: BLE001
            entry = {"error": repr(exc)[:500]}
        results[name] = entry
        print(name, json.dumps(entry), flush=True)
        models = denoiser = None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
