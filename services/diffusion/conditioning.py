"""Text and timing conditioning, built per sample exactly as `StableAudioPipeline.__call__` builds it.

For one sample with prompt p, optional negative prompt n, seconds (start, end) and guidance g:
- text tokens: T5(p) → projection → times the attention mask (padding positions become 0);
- cross context (cond): [text (128 tokens), start (1), end (1)];  global context: [start | end] (1, 2·D);
- with CFG (g > 1) the unconditional cross context is [T5(n) masked, start, end] when n is given, and all
  zeros (seconds tokens included) when it is not; the global context is shared by both branches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from chorus.diffusion.loader import StableAudioModels


@dataclass(frozen=True, slots=True)
class ConditioningRequest:
    prompt: str
    negative_prompt: str | None
    start_s: float
    end_s: float
    guidance_scale: float

    @property
    def uses_cfg(self) -> bool:
        return self.guidance_scale > 1.0


@dataclass(frozen=True, slots=True)
class SampleConditioning:
    """One sample's DiT conditioning, fp32 on the model device.

    cross_context: (T + 2, D); uncond_cross_context: (T + 2, D) or None without CFG; global_context: (1, 2·D);
    num_prompt_tokens counts the prompt's tokens (EOS included, padding excluded)."""

    cross_context: torch.Tensor
    uncond_cross_context: torch.Tensor | None
    global_context: torch.Tensor
    num_prompt_tokens: int


@torch.inference_mode()
def encode_text(models: StableAudioModels, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T, D) fp32 projected T5 states with padding zeroed, and the (N, T) attention mask."""
    tokens = models.tokenizer(
        list(texts),
        padding="max_length",
        max_length=models.tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    )
    input_ids = tokens.input_ids.to(models.device)
    mask = tokens.attention_mask.to(models.device)
    states = models.text_encoder(input_ids, attention_mask=mask)[0]
    states = models.projection_model(text_hidden_states=states).text_hidden_states
    return states * mask.unsqueeze(-1).to(states.dtype), mask


@torch.inference_mode()
def encode_seconds(
    models: StableAudioModels, start_s: Sequence[float], end_s: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 1, D) fp32 embeddings of the start and end seconds."""
    output = models.projection_model(
        start_seconds=torch.tensor([float(s) for s in start_s], device=models.device),
        end_seconds=torch.tensor([float(s) for s in end_s], device=models.device),
    )
    return output.seconds_start_hidden_states, output.seconds_end_hidden_states


def build_conditioning(models: StableAudioModels, requests: Sequence[ConditioningRequest]) -> list[SampleConditioning]:
    """Conditioning of every request, with one T5 call over all prompts and negative prompts."""
    negatives = [r.negative_prompt for r in requests if r.uses_cfg and r.negative_prompt is not None]
    text_states, text_mask = encode_text(models, [r.prompt for r in requests] + negatives)
    start, end = encode_seconds(models, [r.start_s for r in requests], [r.end_s for r in requests])
    conditioning = []
    next_negative = len(requests)
    for index, request in enumerate(requests):
        seconds_tokens = torch.cat([start[index], end[index]], dim=0)
        cross_context = torch.cat([text_states[index], seconds_tokens], dim=0)
        uncond_cross_context = None
        if request.uses_cfg and request.negative_prompt is not None:
            uncond_cross_context = torch.cat([text_states[next_negative], seconds_tokens], dim=0)
            next_negative += 1
        elif request.uses_cfg:
            uncond_cross_context = torch.zeros_like(cross_context)
        conditioning.append(
            SampleConditioning(
                cross_context=cross_context,
                uncond_cross_context=uncond_cross_context,
                global_context=torch.cat([start[index], end[index]], dim=-1),
                num_prompt_tokens=int(text_mask[index].sum()),
            )
        )
    return conditioning
