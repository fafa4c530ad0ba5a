"""A batch of prompts embedded together is each prompt embedded alone (to rounding: GEMM blocking varies with the
number of rows), right-padded with zeros. The engine embeds every prefill batch in one go, whatever mix of voices
and prompt layouts it holds. A frame's codes embed alike through one fused table."""

from __future__ import annotations

import copy

import numpy as np
import torch

from chorus.talker.prompt import NONE, Part, VoiceRequest, build_prompt, embed_prompts

ROLE = [151644, 77091, 198]


def _voices(hidden_size: int) -> list[VoiceRequest]:
    generator = torch.Generator().manual_seed(0)
    speaker = torch.randn(hidden_size, generator=generator)
    ref_codes = torch.randint(0, 2048, (5, 16), generator=generator)
    return [
        VoiceRequest("custom_voice", ROLE, [11, 12, 13, 14], speaker="ryan"),
        VoiceRequest("voice_clone", ROLE, [21, 22], speaker_vector=speaker, non_streaming_text=True),
        VoiceRequest(
            "voice_clone", ROLE, [31, 32, 33], speaker_vector=speaker, ref_text_ids=[41, 42], ref_codes=ref_codes
        ),
        VoiceRequest("custom_voice", ROLE, [51], speaker="vivian", language="english"),
    ]


def test_a_batch_embeds_like_its_prompts_alone(tiny_loaded):
    talker = tiny_loaded.model.talker
    voices = _voices(tiny_loaded.config.talker.hidden_size)
    prompts = [build_prompt(tiny_loaded.config, voice) for voice in voices]
    assert voices[2].icl and (prompts[2].positions[:, Part.REF_FRAME] != NONE).any()
    with torch.inference_mode():
        batch, lengths = embed_prompts(talker, prompts, voices)
        alone = [embed_prompts(talker, [prompt], [voice]) for prompt, voice in zip(prompts, voices, strict=True)]
    assert lengths == [prompt.num_positions for prompt in prompts]
    assert batch.shape[:2] == (len(prompts), max(lengths))
    for row, (embeds, (length,)) in enumerate(alone):
        assert embeds.shape[:2] == (1, length)
        torch.testing.assert_close(batch[row, :length], embeds[0], rtol=1e-6, atol=1e-6)
        assert not batch[row, length:].any()


def test_prefix_frames_take_the_positions_their_decode_steps_fed(tiny_loaded):
    config, talker = tiny_loaded.config, tiny_loaded.model.talker
    frames = torch.randint(0, 2048, (5, 16), generator=torch.Generator().manual_seed(1))
    fresh = VoiceRequest("custom_voice", ROLE, [11, 12, 13], speaker="ryan")  # streaming layout: trailing 12, 13, EOS
    resumed = VoiceRequest("custom_voice", ROLE, [11, 12, 13], speaker="ryan", prefix_frames=frames)
    fresh_prompt, prompt = build_prompt(config, fresh), build_prompt(config, resumed)
    head = fresh_prompt.num_positions
    np.testing.assert_array_equal(prompt.positions[:head], fresh_prompt.positions)
    assert prompt.trailing_text_ids == fresh_prompt.trailing_text_ids, "still indexed by frame"
    text_ids = [12, 13, config.text_ids.tts_eos, config.text_ids.tts_pad, config.text_ids.tts_pad]
    prefix = prompt.positions[head:]
    assert prefix[:, Part.TEXT_ID].tolist() == text_ids and prefix[:, Part.PREFIX_FRAME].tolist() == list(range(5))
    assert (prefix[:, [Part.CODEC_ID, Part.SPEAKER, Part.REF_FRAME]] == NONE).all(), "frame and text only"
    with torch.inference_mode():
        embeds, (length,) = embed_prompts(talker, [prompt], [resumed])
        decode_inputs = talker.embed_frame(frames) + talker.embed_text(torch.tensor(text_ids))
    assert length == head + 5
    torch.testing.assert_close(embeds[0, head:], decode_inputs, rtol=1e-6, atol=1e-6)


def test_the_fused_frame_table_embeds_frames_as_the_separate_tables_do(tiny_loaded):
    """`fuse_frame_embeddings` (serving on CUDA) gathers a frame's 16 rows from one table: the same sums, bit for
    bit, and the same checkpoint keys, each embedding's weight now a view of the table."""
    talker = copy.deepcopy(tiny_loaded.model.talker)
    config = tiny_loaded.config
    generator = torch.Generator().manual_seed(3)
    codes = torch.cat(
        (
            torch.randint(0, config.codec_vocab_size, (4, 7, 1), generator=generator),
            torch.randint(0, config.code_vocab_size, (4, 7, config.num_code_groups - 1), generator=generator),
        ),
        dim=-1,
    )
    codes[0, 0, 0], codes[0, 0, 1:] = config.codec_vocab_size - 1, config.code_vocab_size - 1  # each table's last row
    keys = set(talker.state_dict())
    with torch.inference_mode():
        separate = talker.embed_frame(codes)
        talker.fuse_frame_embeddings()
        fused = talker.embed_frame(codes)
    assert torch.equal(fused, separate)
    assert set(talker.state_dict()) == keys
    last = talker.code_predictor.model.codec_embedding[-1].weight
    assert last.data_ptr() == talker.frame_table[-config.code_vocab_size :].data_ptr()
