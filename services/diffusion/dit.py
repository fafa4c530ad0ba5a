"""The one place the Stable Audio DiT runs: a forward over diffusers' `StableAudioDiTModel` submodules.

It follows `StableAudioDiTModel.forward` with serving changes: the Fourier time embedding is computed
in fp32 from fp32 timesteps and frequencies (the stock forward rounds t = atan(σ)·2/π to the model dtype
first, which merges neighbouring steps in fp16/bf16); timesteps are per sample, so a batch may mix steps;
the rotary tables are built once per length on the device instead of being copied from the host in
every attention call; attention runs with fused projections (chorus.diffusion.attention); each block
ends with the next block's input norm, so the residual add and that norm are one kernel when compiled;
blocks may be compiled. chorus.diffusion.parallel shards it over processes (CFG rows, heads or tokens).
"""

from __future__ import annotations

import contextlib
import math

import torch
from diffusers import StableAudioDiTModel
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.transformers.stable_audio_transformer import StableAudioDiTBlock
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from chorus.diffusion.attention import install_attention

# SDPA kernels tried in order; each list ends in the math kernel so every device has one that runs.
ATTENTION_BACKENDS: dict[str, list[SDPBackend] | None] = {
    "auto": None,  # PyTorch's own choice
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}
# Inductor modes that leave CUDA graphs to GraphedDenoiser (its own capture would nest with theirs).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


class ChainedBlock(nn.Module):
    """`StableAudioDiTBlock.forward` taking its input already normalised by its `norm1` and returning, besides
    its output, that output normalised by the next block's `norm1`: the same operations as the stock loop,
    regrouped so the block's last residual add and the next block's norm fuse into one pass over the
    activations (a compiled block otherwise ends in a lone add that a separate norm kernel reads back)."""

    def __init__(self, block: StableAudioDiTBlock, next_norm: nn.LayerNorm | None) -> None:
        super().__init__()
        self.block = block
        self.next_norm = next_norm

    def forward(
        self,
        hidden: torch.Tensor,
        normed: torch.Tensor,
        cross_states: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: (B, N, dim) block input; normed: block.norm1(hidden). Returns the block output and it
        normalised by next_norm (the output itself after the last block)."""
        block = self.block
        hidden = block.attn1(normed, rotary_emb=rotary) + hidden
        hidden = block.attn2(block.norm2(hidden), encoder_hidden_states=cross_states) + hidden
        hidden = block.ff(block.norm3(hidden)) + hidden
        return hidden, hidden if self.next_norm is None else self.next_norm(hidden)


class StableAudioDenoiser:
    """Velocity prediction of the Stable Audio DiT.

    Args:
        transformer: the DiT, in its run dtype (fp16/bf16/fp32). Its attention projections are
            fused and its processors replaced (install_attention: same results, fewer and wider GEMMs).
        time_frequencies: (time_proj_dim // 2,) fp32 copy of `transformer.time_proj.weight`.
        compile_blocks: run each transformer block through torch.compile (static shapes).
        compile_mode: one of COMPILE_MODES; max-autotune-no-cudagraphs benchmarks Triton GEMM templates
            (with fused epilogues) against cuBLAS per shape, at the cost of minutes of start-up.
        attention_backend: a key of ATTENTION_BACKENDS; the SDPA kernel order for every attention call.
    """

    def __init__(
        self,
        transformer: StableAudioDiTModel,
        time_frequencies: torch.Tensor,
        compile_blocks: bool = False,
        compile_mode: str = "default",
        attention_backend: str = "auto",
    ) -> None:
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode: expected one of {COMPILE_MODES}, got {compile_mode!r}")
        if attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend: expected one of {sorted(ATTENTION_BACKENDS)}, got {attention_backend!r}"
            )
        self._attention_backends = ATTENTION_BACKENDS[attention_backend]
        install_attention(transformer)
        self.transformer = transformer
        self.time_frequencies = time_frequencies
        self._rotary_by_length: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        blocks = transformer.transformer_blocks
        self._first_norm = blocks[0].norm1
        self._blocks = [
            ChainedBlock(block, next_block.norm1 if next_block is not None else None)
            for block, next_block in zip(blocks, [*blocks[1:], None], strict=True)
        ]
        if compile_blocks:
            # Regional compilation: the blocks share one compiled graph per input shape (the last, without a next
            # norm, has its own), and the CUDA-graph buckets keep the shapes to a handful: two graphs per bucket,
            # more than dynamo's default limit of 8 per function. Wrappers, so the transformer stays uncompiled.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self._blocks = [
                torch.compile(block, dynamic=False, fullgraph=True, mode=compile_mode) for block in self._blocks
            ]

    @torch.inference_mode()
    def __call__(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        cross_context: torch.Tensor,
        global_context: torch.Tensor,
    ) -> torch.Tensor:
        """latents: (B, C, L) already scaled by c_in, any float dtype; timesteps: (B,) fp32;
        cross_context: (B, T, cross_attention_input_dim) text + seconds tokens;
        global_context: (B, 1, global_states_input_dim) seconds embedding.
        Returns the velocity, (B, C, L), in the model dtype."""
        hidden, cross_states = self.embed(latents, timesteps, cross_context, global_context)
        hidden = self.run_blocks(hidden, cross_states, self.rotary(hidden.shape[1], hidden.device))
        return self.project_out(hidden)

    def embed(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        cross_context: torch.Tensor,
        global_context: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs of the first block: hidden (B, 1 + L, inner_dim), the global token first, and the
        projected cross-attention states (B, T, cross_attention_dim); arguments as __call__."""
        model = self.transformer
        dtype = model.dtype
        cross_states = model.cross_attention_proj(cross_context.to(dtype))
        global_states = model.global_proj(global_context.to(dtype))
        global_states = global_states + model.timestep_proj(self._time_features(timesteps).to(dtype)).unsqueeze(1)

        hidden = latents.to(dtype)
        hidden = model.preprocess_conv(hidden) + hidden
        hidden = model.proj_in(hidden.transpose(1, 2))
        return torch.cat([global_states, hidden], dim=-2), cross_states

    def run_blocks(
        self, hidden: torch.Tensor, cross_states: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """hidden: (B, N, inner_dim) through every block; rotary: cos, sin (num_tokens, rotary_dim) fp32 of
        the whole sequence (sequence-parallel ranks hold a slice of the tokens but attend over all)."""
        # Set around the compiled blocks too: their first call traces SDPA to the kernel chosen here.
        with self._attention_kernels():
            normed = self._first_norm(hidden)
            for block in self._blocks:
                hidden, normed = block(hidden, normed, cross_states, rotary)
        return hidden

    def project_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, 1 + L, inner_dim) after the blocks → velocity (B, C, L) in the model dtype."""
        model = self.transformer
        hidden = model.proj_out(hidden).transpose(1, 2)[:, :, 1:]
        return model.postprocess_conv(hidden) + hidden

    def _attention_kernels(self) -> contextlib.AbstractContextManager:
        if self._attention_backends is None:
            return contextlib.nullcontext()
        return sdpa_kernel(self._attention_backends, set_priority=True)

    def _time_features(self, timesteps: torch.Tensor) -> torch.Tensor:
        """(B, time_proj_dim) fp32 [cos, sin] Fourier features, as the model's flip_sin_to_cos projection."""
        angles = 2 * math.pi * timesteps.to(torch.float32)[:, None] * self.time_frequencies[None, :]
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    def rotary(self, num_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: (num_tokens, rotary_dim) fp32 on `device`, built once per length."""
        if num_tokens not in self._rotary_by_length:
            rotary_dim = self.transformer.config.attention_head_dim // 2
            cos, sin = get_1d_rotary_pos_embed(rotary_dim, num_tokens, use_real=True, repeat_interleave_real=False)
            self._rotary_by_length[num_tokens] = (cos.to(device), sin.to(device))
        return self._rotary_by_length[num_tokens]
