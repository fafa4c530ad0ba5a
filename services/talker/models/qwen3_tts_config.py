"""Architecture and id-space description of a Qwen3-TTS-12Hz checkpoint (parsed from config.json by the loader)."""

from __future__ import annotations

import dataclasses

from chorus.talker.models.qwen3_layers import Qwen3BlockConfig


@dataclasses.dataclass(frozen=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN sizes; `enc_dim` equals the talker width so its vector enters the talker input directly."""

    enc_dim: int
    mel_dim: int = 128
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate_hz: int = 24000


@dataclasses.dataclass(frozen=True)
class CodecIds:
    """Control ids in the talker's codec vocabulary (rows 2048.. of the codec embedding)."""

    pad: int = 2148
    bos: int = 2149
    eos: int = 2150
    think: int = 2154
    nothink: int = 2155
    think_bos: int = 2156
    think_eos: int = 2157


@dataclasses.dataclass(frozen=True)
class TextIds:
    """Special ids in the text vocabulary."""

    im_start: int = 151644
    im_end: int = 151645
    tts_pad: int = 151671
    tts_bos: int = 151672
    tts_eos: int = 151673


@dataclasses.dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: Qwen3BlockConfig
    code_predictor: Qwen3BlockConfig
    model_type: str  # custom_voice | voice_design | base
    model_size: str  # 0b6 | 1b7
    codec_vocab_size: int = 3072
    code_vocab_size: int = 2048
    num_code_groups: int = 16
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    codec_ids: CodecIds = CodecIds()
    text_ids: TextIds = TextIds()
    language_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    speaker_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    speaker_dialects: dict[str, str | bool] = dataclasses.field(default_factory=dict)
    speaker_encoder: SpeakerEncoderConfig | None = None

    @property
    def first_control_id(self) -> int:
        """Ids at or above this are control ids, never sampled except codec EOS (the reference's vocab-1024)."""
        return self.codec_vocab_size - 1024
