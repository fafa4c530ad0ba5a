"""The Qwen3-TTS-12Hz talker (codebook 0) and code predictor (codebooks 1..15).

Attribute names follow the official module tree, so the state-dict keys are the checkpoint's keys. The modules
are pure: caches are passed in by the caller (the runner), sampling happens outside.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chorus.talker.models.qwen3_layers import Qwen3DecoderStack
from chorus.talker.models.qwen3_tts_config import Qwen3TTSConfig
from chorus.talker.models.speaker_encoder import Qwen3TTSSpeakerEncoder


class Qwen3TTSTextProjection(nn.Module):
    """Linear → SiLU → Linear (with biases): text embedding width → talker width."""

    def __init__(self, text_hidden_size: int, hidden_size: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden_size, text_hidden_size)
        self.linear_fc2 = nn.Linear(text_hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Qwen3TTSTalkerBackbone(Qwen3DecoderStack):
    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__(config.talker)
        self.codec_embedding = nn.Embedding(config.codec_vocab_size, config.talker.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class Qwen3TTSCodePredictorBackbone(Qwen3DecoderStack):
    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__(config.code_predictor)
        # Tables are talker-width: the projection to predictor width happens after the lookup.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.code_vocab_size, config.talker.hidden_size) for _ in range(config.num_code_groups - 1)
        )


class Qwen3TTSCodePredictor(nn.Module):
    """Predicts codebooks 1..15 of a frame from the talker's hidden state and codebook 0.

    Per frame: positions 0, 1 hold `[talker hidden, C(c0)]` → head 0 → c1; position j+1 holds `CPemb[j-1](c_j)`
    → head j → c_{j+1}, for j = 1..14. Its KV cache never exceeds `num_code_groups` positions.
    """

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.model = Qwen3TTSCodePredictorBackbone(config)
        self.lm_head = nn.ModuleList(
            nn.Linear(config.code_predictor.hidden_size, config.code_vocab_size, bias=False)
            for _ in range(config.num_code_groups - 1)
        )
        if config.code_predictor.hidden_size != config.talker.hidden_size:
            self.small_to_mtp_projection = nn.Linear(config.talker.hidden_size, config.code_predictor.hidden_size)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def embed(self, codebook: int, codes: torch.Tensor) -> torch.Tensor:
        """Talker-width embedding `[..., H]` of `codes [...]` of codebook `codebook` (1..15)."""
        return self.model.codec_embedding[codebook - 1](codes)

    def embedding(self, codebook: int) -> torch.Tensor:
        """The table `[V, H]` behind `embed(codebook, ...)`."""
        return self.model.codec_embedding[codebook - 1].weight

    def forward(self, inputs_embeds, positions, kv_caches, head_index: int, block_table=None) -> torch.Tensor:
        """Logits `[B, 2048]` for codebook `head_index + 1` from `inputs_embeds [B, T, H_talker]` at `positions`.

        The attended length is the whole predictor cache (`num_code_groups` positions), masked causally; on the
        Triton decode path the caches are paged (see `Qwen3DecoderStack.forward`).
        """
        projected = self.small_to_mtp_projection(inputs_embeds)
        head, stack = self.lm_head[head_index], self.model
        if stack.takes_few_rows(positions):  # the final norm and the head in one kernel
            residual = stack.few_rows_residual(projected, positions, kv_caches, block_table)
            return stack.norm_and_project(residual[:, -1], head.weight)
        hidden = stack(projected, positions, kv_caches, kv_caches[0].shape[3], block_table)
        return head(hidden[:, -1])


class Qwen3TTSTalker(nn.Module):
    """Talker: Qwen3 decoder over summed text + codec embeddings; `codec_head` scores codebook 0 and controls."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.model = Qwen3TTSTalkerBackbone(config)
        self.text_projection = Qwen3TTSTextProjection(config.text_hidden_size, config.talker.hidden_size)
        self.codec_head = nn.Linear(config.talker.hidden_size, config.codec_vocab_size, bias=False)
        self.code_predictor = Qwen3TTSCodePredictor(config)
        self.frame_table: torch.Tensor | None = None  # set by `fuse_frame_embeddings`
        self.frame_offsets: torch.Tensor | None = None

    def embed_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        """`text_ids [...]` → projected text embeddings `[..., H]`."""
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_codec(self, codec_ids: torch.Tensor) -> torch.Tensor:
        """`codec_ids [...]` (codebook-0 codes or control ids) → `[..., H]`."""
        return self.model.codec_embedding(codec_ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """`codes [..., 16]` of whole frames → `[..., H]`: C(c0) + Σ_j CPemb[j-1](c_j), summed in one reduction."""
        if self.frame_table is not None:  # the same 16 rows, gathered at once
            return F.embedding(codes + self.frame_offsets, self.frame_table).sum(-2)
        parts = [self.embed_codec(codes[..., 0])]
        parts += [self.code_predictor.embed(j, codes[..., j]) for j in range(1, codes.shape[-1])]
        return torch.stack(parts, dim=-2).sum(-2)

    def fuse_frame_embeddings(self) -> None:
        """One table for a frame's 16 lookups (serving only, like `Qwen3Attention.fuse_projections`): the codec
        embedding's rows, then each code-predictor codebook's. Each embedding's weight becomes a view of its rows, so
        no table is held twice and the state-dict keys stay the checkpoint's. Compiled, 16 separate lookups were 17
        kernels a step (bench/results/kernels-20261126-215350); one gather and its sum leave Inductor one to fuse."""
        embeddings = [self.model.codec_embedding, *self.code_predictor.model.codec_embedding]
        table = torch.cat([embedding.weight.detach() for embedding in embeddings])
        offsets, start = [], 0
        for embedding in embeddings:
            embedding.weight = nn.Parameter(table[start : start + embedding.num_embeddings], requires_grad=False)
            offsets.append(start)
            start += embedding.num_embeddings
        self.frame_table = table
        self.frame_offsets = torch.tensor(offsets, device=table.device)

    def forward(self, inputs_embeds, positions, kv_caches, attended_length: int, block_table=None):
        """`inputs_embeds [B, T, H]` at `positions [B, T]` → (post-norm hidden `[B, T, H]`, logits of the last
        position `[B, 3072]`); caches as `Qwen3DecoderStack.forward` takes them."""
        hidden = self.model(inputs_embeds, positions, kv_caches, attended_length, block_table)
        return hidden, self.codec_head(hidden[:, -1])


class Qwen3TTSModel(nn.Module):
    """Talker + code predictor, plus the ECAPA-TDNN speaker encoder for Base checkpoints."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.config = config
        self.talker = Qwen3TTSTalker(config)
        self.speaker_encoder = (
            Qwen3TTSSpeakerEncoder(config.speaker_encoder) if config.speaker_encoder is not None else None
        )
