"""Talker prompts for every mode and text layout, position for position as the reference builds them.

A prompt is a list of positions, each the sum of an optional text part `T(id)` and an optional codec part (a
codec id, the speaker vector, or a reference frame `E(frame)`), plus the text ids fed one per decode step
afterwards ("trailing text"; the text pad id once they run out).

Layouts (spec §2.3): the head is `[instruct?] + role (3 text ids) + [PAD + K_i ...] + [BOS + C(codec_pad)]` with
`K` = language tag, optional speaker slot, codec pad; then
- streaming text: `T(t1) + C(codec_bos)`; trailing = t2..tN, EOS (text may keep arriving);
- non-streaming text: `T(t_i) + C(codec_pad)` for every token, `EOS + C(codec_pad)`, `PAD + C(codec_bos)`;
- ICL voice clone: text = ref ‖ target ‖ EOS over codec = codec_bos, E(ref frames), overlaid (streaming) or one
  after the other (non-streaming).

A request resumed after frames it already produced (fail-over to another replica) appends one position per such
frame, exactly what the decode step of frame i fed the talker: `E(frame i) + T(trailing text id i)`. Its trailing
text stays indexed by frame, so generation goes on with id N.

Positions are rows of a NumPy array, one column per part, built a block of positions at a time: the engine thread
builds and embeds every new request's prompt, and a Python object per position cost more host time there than
the prefill forward's launch.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import torch

from chorus.talker.models.qwen3_tts_config import Qwen3TTSConfig

SPEAKER_SLOT = "speaker"
LANGUAGE_AUTO = "auto"


class PromptError(ValueError):
    """A synthesis request that cannot be turned into a prompt; the message names the field and valid values."""


class Part(enum.IntEnum):
    """A prompt's columns: what a position sums. `NONE` where a position lacks that part."""

    TEXT_ID = 0
    CODEC_ID = 1
    SPEAKER = 2  # 1: the request's speaker vector
    REF_FRAME = 3  # index into `VoiceRequest.ref_codes`
    PREFIX_FRAME = 4  # index into `VoiceRequest.prefix_frames`


NONE = -1


def positions(count: int, **parts) -> np.ndarray:
    """`count` positions `[count, len(Part)]`, each part (`text_id=`, `codec_id=`, … by `Part` name) one value for
    all of them or one per position; parts not given are `NONE`."""
    block = np.full((count, len(Part)), NONE, dtype=np.int64)
    for name, values in parts.items():
        block[:, Part[name.upper()]] = values
    return block


@dataclasses.dataclass(eq=False)
class VoiceRequest:
    """What a request asks for, in token ids. `text_ids` are the target text tokens (role and template removed).

    mode: `custom_voice` (named `speaker`), `voice_design` (`instruct_ids`), `voice_clone` (`speaker_vector [H]`
    or `ref_audio`, plus `ref_text_ids` and `ref_codes [R, 16]` for ICL). `text_complete` False: more text may
    arrive. `prefix_frames [N, 16]`: frames this request already produced elsewhere; generation resumes at frame N.
    """

    mode: str
    role_ids: list[int]
    text_ids: list[int]
    text_complete: bool = True
    language: str = LANGUAGE_AUTO
    speaker: str | None = None
    instruct_ids: list[int] | None = None
    speaker_vector: torch.Tensor | None = None
    ref_audio: torch.Tensor | None = None  # 24 kHz mono samples; the x-vector is computed from it when needed
    ref_text_ids: list[int] | None = None
    ref_codes: torch.Tensor | None = None
    non_streaming_text: bool = False
    prefix_frames: torch.Tensor | None = None

    @property
    def icl(self) -> bool:
        return self.mode == "voice_clone" and self.ref_codes is not None

    @property
    def num_prefix_frames(self) -> int:
        return 0 if self.prefix_frames is None else self.prefix_frames.shape[0]


@dataclasses.dataclass
class Prompt:
    positions: np.ndarray  # [num_positions, len(Part)]
    trailing_text_ids: list[int]  # id i goes with frame i (a resumed prompt's prefix frames took the first N)
    streams_text: bool  # target text still arriving: its ids append to the trailing text, then EOS

    @property
    def num_positions(self) -> int:
        return len(self.positions)

    @property
    def plain(self) -> bool:
        """Text and codec ids only: no speaker vector, reference frame or prefix frame (a named or designed voice,
        not resumed), so the ids alone give its embeddings."""
        return bool((self.positions[:, Part.SPEAKER :] == NONE).all())

    def text_id_for(self, frame: int, pad_id: int) -> int | None:
        """Text id the decode step of `frame` adds; `None` while the text it needs has not arrived yet."""
        if frame < len(self.trailing_text_ids):
            return self.trailing_text_ids[frame]
        return None if self.streams_text else pad_id


MODES = ("custom_voice", "voice_design", "voice_clone")


def validate(config: Qwen3TTSConfig, request: VoiceRequest) -> None:
    """Raise `PromptError` naming the field and the valid choices for anything the reference would reject."""
    if request.mode not in MODES:
        raise PromptError(f"mode: unknown {request.mode!r}; valid: {', '.join(MODES)}")
    languages = sorted([LANGUAGE_AUTO, *(name for name in config.language_ids if "dialect" not in name)])
    if request.language.lower() != LANGUAGE_AUTO and request.language.lower() not in config.language_ids:
        raise PromptError(f"language: unknown {request.language!r}; valid: {', '.join(languages)}")
    known_speaker = bool(request.speaker) and request.speaker.lower() in config.speaker_ids
    if request.mode == "custom_voice" and not known_speaker:
        valid = ", ".join(sorted(config.speaker_ids)) or "none (this checkpoint has no named speakers)"
        raise PromptError(f"speaker: unknown {request.speaker!r}; valid: {valid}")
    if request.mode == "voice_clone":
        if request.speaker_vector is None and request.ref_audio is None:
            raise PromptError("ref_audio: voice clone needs a reference voice (audio or speaker embedding)")
        if request.speaker_vector is not None and request.speaker_vector.shape != (config.talker.hidden_size,):
            raise PromptError(f"speaker_embedding: must have {config.talker.hidden_size} values")
        if request.speaker_vector is None and config.speaker_encoder is None:
            raise PromptError("ref_audio: this checkpoint has no speaker encoder; pass a speaker embedding")
        if request.ref_codes is not None and not request.ref_text_ids:
            raise PromptError("ref_text: in-context voice clone needs the reference transcript")
        if request.ref_codes is not None and (request.ref_codes.ndim != 2 or request.ref_codes.shape[0] == 0):
            raise PromptError("ref_audio: reference codes must be a non-empty [frames, 16] array")
    if len(request.role_ids) != 3:
        raise PromptError("text: the role prefix must be exactly 3 tokens")
    if request.text_complete and not request.text_ids:
        raise PromptError("text: must not be empty")
    prefix = request.prefix_frames
    if prefix is not None:
        if prefix.ndim != 2 or prefix.shape[1] != config.num_code_groups:
            raise PromptError(
                f"prefix_frames: must be [frames, {config.num_code_groups}] codes, got {list(prefix.shape)}"
            )
        if prefix.numel() and not 0 <= int(prefix.min()) <= int(prefix.max()) < config.code_vocab_size:
            raise PromptError(f"prefix_frames: codes must be in 0..{config.code_vocab_size - 1}")


def _language_tag(config: Qwen3TTSConfig, request: VoiceRequest) -> list[int]:
    ids = config.codec_ids
    language = request.language.lower()
    language_id = None if language == LANGUAGE_AUTO else config.language_ids[language]
    if request.mode == "custom_voice" and language in ("chinese", LANGUAGE_AUTO):
        dialect = config.speaker_dialects.get(request.speaker.lower(), False)
        if dialect:
            language_id = config.language_ids[dialect]
    if language_id is None:
        return [ids.nothink, ids.think_bos, ids.think_eos]
    return [ids.think, ids.think_bos, language_id, ids.think_eos]


def build_prompt(config: Qwen3TTSConfig, request: VoiceRequest) -> Prompt:
    """The prompt of a validated request whose text suffices (all of it, or for streaming text one token plus one
    per prefix frame)."""
    prompt = _fresh_prompt(config, request)
    if request.num_prefix_frames:
        pad_id = config.text_ids.tts_pad
        text_ids = [prompt.text_id_for(index, pad_id) for index in range(request.num_prefix_frames)]
        assert None not in text_ids, "the engine waits for the prefix frames' text"
        prefix = positions(len(text_ids), text_id=text_ids, prefix_frame=np.arange(len(text_ids)))
        prompt.positions = np.concatenate((prompt.positions, prefix))
    return prompt


def _fresh_prompt(config: Qwen3TTSConfig, request: VoiceRequest) -> Prompt:
    ids, text = config.codec_ids, config.text_ids
    instruct = request.instruct_ids if not (request.mode == "custom_voice" and config.model_size == "0b6") else None
    codec_slots = _language_tag(config, request)
    speaker_slot = len(codec_slots)
    if request.mode == "custom_voice":
        codec_slots.append(config.speaker_ids[request.speaker.lower()])
    elif request.mode == "voice_clone":
        codec_slots.append(NONE)  # the speaker vector's place
    codec_slots.append(ids.pad)
    slots = positions(len(codec_slots), text_id=text.tts_pad, codec_id=codec_slots)
    slots[-1, Part.TEXT_ID] = text.tts_bos
    if request.mode == "voice_clone":
        slots[speaker_slot, Part.SPEAKER] = 1
    head = [positions(len(instruct or ()), text_id=instruct or ()), positions(3, text_id=request.role_ids), slots]

    target = list(request.text_ids)
    if request.icl:
        return _icl_prompt(config, request, head, target)
    if request.non_streaming_text:
        body = [
            positions(len(target), text_id=target, codec_id=ids.pad),
            positions(1, text_id=text.tts_eos, codec_id=ids.pad),
            positions(1, text_id=text.tts_pad, codec_id=ids.bos),
        ]
        return Prompt(np.concatenate(head + body), [], streams_text=False)
    body = [positions(1, text_id=target[0], codec_id=ids.bos)]
    trailing = target[1:] + ([text.tts_eos] if request.text_complete else [])
    return Prompt(np.concatenate(head + body), trailing, streams_text=not request.text_complete)


def _icl_prompt(config: Qwen3TTSConfig, request: VoiceRequest, head: list[np.ndarray], target: list[int]) -> Prompt:
    ids, text = config.codec_ids, config.text_ids
    text_track = list(request.ref_text_ids) + target + [text.tts_eos]
    num_ref_frames = request.ref_codes.shape[0]
    codec_track = positions(1 + num_ref_frames, codec_id=[ids.bos] + [NONE] * num_ref_frames)
    codec_track[1:, Part.REF_FRAME] = np.arange(num_ref_frames)
    if request.non_streaming_text:
        codec_track[:, Part.TEXT_ID] = text.tts_pad
        block = [positions(len(text_track), text_id=text_track, codec_id=ids.pad), codec_track]
        return Prompt(np.concatenate(head + block), [], streams_text=False)
    overlap = min(len(text_track), len(codec_track))
    codec_track[:overlap, Part.TEXT_ID] = text_track[:overlap]
    codec_track[overlap:, Part.TEXT_ID] = text.tts_pad
    return Prompt(np.concatenate([*head, codec_track]), text_track[len(codec_track) :], streams_text=False)


def embed_prompts(talker, prompts: list[Prompt], requests: list[VoiceRequest]) -> tuple[torch.Tensor, list[int]]:
    """Prefill input `[B, L, H]` of a batch of prompts through the talker's embeddings (`talker`:
    `Qwen3TTSTalker`), right-padded with zeros to the longest, and each prompt's length.

    One embedding call per kind of part for the whole batch, not per prompt: each call from the host is a few
    launches and a copy, which under load cost more than the prefill forward itself. Each position's parts are
    summed in the same order as the reference (text, codec, frame, speaker); a prefix frame's position sums what the
    decode step that produced it summed (frame and text)."""
    weight = talker.model.codec_embedding.weight
    device, dtype = weight.device, weight.dtype
    lengths = [prompt.num_positions for prompt in prompts]
    longest = max(lengths)
    batch = np.full((len(prompts), longest, len(Part)), NONE, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        batch[row, : lengths[row]] = prompt.positions
    flat = batch.reshape(-1, len(Part))  # position `row * longest + i`: row's position i
    text_at = np.flatnonzero(flat[:, Part.TEXT_ID] != NONE)
    codec_at = np.flatnonzero(flat[:, Part.CODEC_ID] != NONE)
    frame_at, frames, speaker_at, speakers = [], [], [], []
    for row in np.flatnonzero((batch[..., Part.REF_FRAME :] != NONE).any(axis=(1, 2))):  # rows with frames
        prompt, request = prompts[row], requests[row]
        for part, codes in ((Part.REF_FRAME, request.ref_codes), (Part.PREFIX_FRAME, request.prefix_frames)):
            at = np.flatnonzero(prompt.positions[:, part] != NONE)
            if len(at):  # ref frames come before prefix frames in a prompt: `frame_at` stays in position order
                frame_at.append(row * longest + at)
                frames.append(codes[torch.from_numpy(prompt.positions[at, part])])
    for row in np.flatnonzero((batch[..., Part.SPEAKER] != NONE).any(axis=1)):
        at = np.flatnonzero(prompts[row].positions[:, Part.SPEAKER] != NONE)
        speaker_at.append(row * longest + at)
        speakers += [requests[row].speaker_vector.to(device=device, dtype=dtype)] * len(at)
    frame_at = np.concatenate(frame_at) if frame_at else np.zeros(0, dtype=np.int64)
    speaker_at = np.concatenate(speaker_at) if speaker_at else np.zeros(0, dtype=np.int64)
    parts = (text_at, flat[text_at, Part.TEXT_ID], codec_at, flat[codec_at, Part.CODEC_ID], frame_at, speaker_at)
    ids = torch.from_numpy(np.concatenate(parts)).to(device, non_blocking=True)
    text_at_t, text_ids_t, codec_at_t, codec_ids_t, frame_at_t, speaker_at_t = ids.split([len(p) for p in parts])
    embeds = torch.zeros(len(prompts) * longest, weight.shape[1], device=device, dtype=dtype)
    if len(text_at):
        embeds.index_add_(0, text_at_t, talker.embed_text(text_ids_t))
    if len(codec_at):
        embeds.index_add_(0, codec_at_t, talker.embed_codec(codec_ids_t))
    if len(frame_at):
        codes = torch.cat(frames).to(device=device, dtype=torch.long)
        embeds.index_add_(0, frame_at_t, talker.embed_frame(codes))
    if len(speaker_at):
        embeds.index_add_(0, speaker_at_t, torch.stack(speakers))
    return embeds.view(len(prompts), longest, -1), lengths
