"""Parity with the official qwen-tts 0.1.1 talker (run from .venv-ref as a subprocess) on a random checkpoint.

Greedy: identical codes for all 16 codebooks and the same stop frame, for every mode and text layout, with
repetition penalty 1.0 and 1.05; our side runs all cases of a penalty together in one engine batch (modes,
layouts and prompt lengths mixed), the reference runs them in its own left-padded batches.
Sampled: the reference's processed probabilities (after penalty, suppression, temperature, top-k, top-p) match
ours step by step, teacher-forced on the codes the reference drew.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.loader import TINY_CONFIG, TINY_SEED, build_random, load_checkpoint, save_official
from chorus.talker.prompt import VoiceRequest, build_prompt, embed_prompts
from chorus.talker.sampling import RowParams, SamplingParams, penalize_and_suppress, warp

pytestmark = pytest.mark.parity

REPO = Path(__file__).resolve().parents[2]
REFERENCE_PYTHON = REPO / ".venv-ref" / "bin" / "python"
ROLE = [151644, 77091, 198]
TEMPLATE_END = [151645, 198, 151644, 77091, 198]
MAX_NEW_TOKENS = 16
PENALTIES = (1.0, 1.05)


def _ids(seed: int, count: int) -> list[int]:
    return torch.randint(0, 151000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _speaker_vector(seed: int) -> torch.Tensor:
    return torch.randn(64, generator=torch.Generator().manual_seed(seed))


def _speaker_audio() -> torch.Tensor:
    """1.5 s at 24 kHz: a gliding tone plus seeded noise, inside [-1, 1]."""
    time_s = torch.arange(36000) / 24000
    noise = torch.randn(36000, generator=torch.Generator().manual_seed(5))
    return 0.5 * torch.sin(2 * torch.pi * (220 + 200 * time_s) * time_s) + 0.1 * noise


def _ref_codes(seed: int, num_frames: int) -> torch.Tensor:
    return torch.randint(0, 2048, (num_frames, 16), generator=torch.Generator().manual_seed(seed))


@dataclasses.dataclass
class Case:
    name: str
    voice: VoiceRequest

    @property
    def clone(self) -> bool:
        return self.voice.mode == "voice_clone"


def _cases() -> list[Case]:
    def voice(mode, seed, num_text, **kwargs):
        return VoiceRequest(mode=mode, role_ids=ROLE, text_ids=_ids(seed, num_text), **kwargs)

    return [
        Case("cv_english", voice("custom_voice", 1, 7, language="english", speaker="ryan", non_streaming_text=True)),
        Case("cv_dialect_auto", voice("custom_voice", 2, 5, speaker="Eric")),
        Case(
            "cv_instruct",
            voice(
                "custom_voice",
                3,
                6,
                language="chinese",
                speaker="vivian",
                instruct_ids=_ids(30, 6),
                non_streaming_text=True,
            ),
        ),
        Case("vd", voice("voice_design", 4, 9, instruct_ids=_ids(40, 5), language="english", non_streaming_text=True)),
        Case("vd_streaming", voice("voice_design", 5, 4, instruct_ids=_ids(50, 8))),
        Case("xvec", voice("voice_clone", 6, 6, speaker_vector=_speaker_vector(60), language="german")),
        Case("xvec_ns", voice("voice_clone", 7, 3, speaker_vector=_speaker_vector(70), non_streaming_text=True)),
        Case(
            "icl_text_longer",
            voice(
                "voice_clone",
                8,
                8,
                speaker_vector=_speaker_vector(80),
                ref_text_ids=_ids(81, 6),
                ref_codes=_ref_codes(82, 3),
            ),
        ),
        Case(
            "icl_codes_longer",
            voice(
                "voice_clone",
                9,
                3,
                speaker_vector=_speaker_vector(90),
                ref_text_ids=_ids(91, 2),
                ref_codes=_ref_codes(92, 12),
            ),
        ),
        Case(
            "icl_ns",
            voice(
                "voice_clone",
                10,
                4,
                speaker_vector=_speaker_vector(100),
                language="english",
                ref_text_ids=_ids(101, 3),
                ref_codes=_ref_codes(102, 5),
                non_streaming_text=True,
            ),
        ),
    ]


def _reference_call(name: str, cases: list[Case], tensors: dict, generation: dict) -> dict:
    """One `generate` call of the reference for `cases` (same layout, same clone-ness), as JSON."""
    kwargs = dict(generation)
    kwargs["input_ids"] = [ROLE + c.voice.text_ids + TEMPLATE_END for c in cases]
    kwargs["languages"] = [c.voice.language for c in cases]
    kwargs["non_streaming_mode"] = cases[0].voice.non_streaming_text
    kwargs["instruct_ids"] = [c.voice.instruct_ids for c in cases]
    call = {"name": name, "kwargs": kwargs, "cases": [c.name for c in cases]}
    if cases[0].clone:
        kwargs["ref_ids"] = [ROLE + c.voice.ref_text_ids + [151645, 198] if c.voice.icl else None for c in cases]
        for c in cases:
            tensors[f"{c.name}.spk"] = c.voice.speaker_vector
            if c.voice.icl:
                tensors[f"{c.name}.ref_code"] = c.voice.ref_codes
        call["voice_clone"] = {
            "ref_spk_embedding": [f"{c.name}.spk" for c in cases],
            "ref_code": [f"{c.name}.ref_code" if c.voice.icl else None for c in cases],
            "x_vector_only_mode": [not c.voice.icl for c in cases],
            "icl_mode": [c.voice.icl for c in cases],
        }
    else:
        kwargs["speakers"] = [c.voice.speaker for c in cases]
    return call


SAMPLED = dict(
    do_sample=True,
    temperature=0.8,
    top_k=40,
    top_p=0.9,
    repetition_penalty=1.05,
    subtalker_dosample=True,
    subtalker_temperature=0.7,
    subtalker_top_k=30,
    subtalker_top_p=0.85,
)
SAMPLED_CASES = ("cv_english", "xvec", "icl_text_longer")


def _run_reference(folder: Path, calls: list[dict], tensors: dict, work: Path) -> dict:
    (work / "calls.json").write_text(json.dumps(calls))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(work / "tensors.safetensors"))
    command = [
        str(REFERENCE_PYTHON),
        str(Path(__file__).with_name("reference_talker.py")),
        str(folder),
        str(work / "calls.json"),
        str(work / "tensors.safetensors"),
        str(work / "outputs.safetensors"),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=900)
    return load_file(str(work / "outputs.safetensors"))


def _greedy_calls(cases: list[Case], penalty: float, tensors: dict) -> list[dict]:
    greedy = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=penalty, max_new_tokens=MAX_NEW_TOKENS)
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault((case.voice.non_streaming_text, case.clone), []).append(case)
    return [
        _reference_call(f"greedy{penalty}.{key[0]}.{key[1]}", group, tensors, greedy) for key, group in groups.items()
    ]


def _greedy_codes(calls: list[dict], outputs: dict) -> dict:
    return {
        (call["kwargs"]["repetition_penalty"], name): outputs[f"{call['name']}.{row}"]
        for call in calls
        for row, name in enumerate(call["cases"])
    }


def _run_ours_greedy(loaded, cases: list[Case], penalty: float) -> dict:
    """All cases in one engine batch; → name: (codes, finish reason)."""
    engine = TalkerEngine(
        loaded,
        EngineConfig(max_streams=16, max_positions=128, max_frames=64, max_buffered_frames=64, use_cuda_graphs=False),
    )
    greedy = SamplingParams(do_sample=False, subtalker_do_sample=False, repetition_penalty=penalty)
    streams = {case.name: engine.submit(case.name, case.voice, greedy, max_frames=MAX_NEW_TOKENS - 1) for case in cases}
    engine.run_until_idle()
    return {name: (torch.from_numpy(s.collect().astype("int64")), s.finish_reason.value) for name, s in streams.items()}


@pytest.fixture(scope="module")
def reference(tiny_folder, tmp_path_factory):
    work = tmp_path_factory.mktemp("talker-reference")
    calls, tensors = [], {}
    for penalty in PENALTIES:
        calls += _greedy_calls(_cases(), penalty, tensors)
    for case in _cases():
        if case.name in SAMPLED_CASES:
            call = _reference_call(f"sampled.{case.name}", [case], tensors, SAMPLED | {"max_new_tokens": 10})
            calls.append(call | {"seed": 7, "record_scores": True})
    tensors["speaker_audio"] = _speaker_audio()
    outputs = _run_reference(tiny_folder, calls, tensors, work)
    by_case = {"speaker_embedding": outputs["speaker_embedding"]}
    by_case |= _greedy_codes([call for call in calls if call["name"].startswith("greedy")], outputs)
    for call in calls:
        if call["name"].startswith("sampled."):
            name = call["name"].removeprefix("sampled.")
            keys = ("0", "scores0", "scores_cp")
            by_case[("sampled", name)] = {key: outputs[f"{call['name']}.{key}"] for key in keys}
    return by_case


@pytest.mark.parametrize("penalty", PENALTIES)
def test_greedy_codes_and_stop_frame_match_reference_in_a_mixed_batch(reference, tiny_loaded, penalty):
    _assert_same_codes(_run_ours_greedy(tiny_loaded, _cases(), penalty), reference, penalty)


def _assert_same_codes(ours: dict, reference: dict, penalty: float) -> None:
    for name, (codes, _) in ours.items():
        expected = reference[(penalty, name)]
        assert codes.shape == expected.shape, f"{name}: stop frame {len(codes)} vs reference {len(expected)}"
        assert torch.equal(codes, expected), f"{name}: codes differ"
    assert {reason for _, reason in ours.values()} == {"eos", "max_length"}, "both stop paths must be exercised"


def test_greedy_parity_with_equal_widths_no_projection(tmp_path_factory):
    """0.6B-style: code predictor as wide as the talker, so `small_to_mtp_projection` is the identity."""
    config = dataclasses.replace(
        TINY_CONFIG, model_size="0b6", code_predictor=dataclasses.replace(TINY_CONFIG.code_predictor, hidden_size=64)
    )
    work = tmp_path_factory.mktemp("talker-identity")
    folder = save_official(build_random(config, TINY_SEED + 1), work / "checkpoint")
    loaded = load_checkpoint(folder)
    assert isinstance(loaded.model.talker.code_predictor.small_to_mtp_projection, torch.nn.Identity)
    cases = [case for case in _cases() if case.name in ("cv_english", "cv_dialect_auto", "vd", "xvec", "icl_ns")]
    tensors: dict = {}
    calls = _greedy_calls(cases, 1.05, tensors)
    reference = _greedy_codes(calls, _run_reference(folder, calls, tensors, work))
    _assert_same_codes(_run_ours_greedy(loaded, cases, 1.05), reference, 1.05)


def _teacher_forced_probabilities(loaded, voice: VoiceRequest, codes: torch.Tensor, params: dict):
    """Our processed probabilities for every codebook-0 step and code-predictor step, fed the given codes."""
    model, config = loaded.model, loaded.config
    talker, predictor = model.talker, model.talker.code_predictor
    talker_params = RowParams(
        torch.tensor([True]),
        torch.tensor([params["temperature"]]),
        torch.tensor([params["top_k"]]),
        torch.tensor([params["top_p"]]),
        torch.tensor([0]),
    )
    predictor_params = RowParams(
        torch.tensor([True]),
        torch.tensor([params["subtalker_temperature"]]),
        torch.tensor([params["subtalker_top_k"]]),
        torch.tensor([params["subtalker_top_p"]]),
        torch.tensor([0]),
    )
    block, cp_block = config.talker, config.code_predictor
    cache = torch.zeros(block.num_hidden_layers, 2, 1, block.num_key_value_heads, 128, block.head_dim)
    cp_cache = torch.zeros(cp_block.num_hidden_layers, 2, 1, cp_block.num_key_value_heads, 16, cp_block.head_dim)
    prompt = build_prompt(config, voice)
    embeds, _ = embed_prompts(talker, [prompt], [voice])
    length = embeds.shape[1]
    hidden, logits = talker(embeds, torch.arange(length)[None], list(cache), length)
    generated = torch.zeros(1, config.codec_vocab_size, dtype=torch.bool)
    code0_probs, predictor_probs = [], []
    for frame_index in range(codes.shape[0] + 1):
        scores = penalize_and_suppress(
            logits,
            generated,
            torch.tensor([frame_index]),
            torch.tensor([params["repetition_penalty"]]),
            torch.tensor([2]),
            config.codec_ids.eos,
            config.first_control_id,
        )
        code0_probs.append(warp(scores, talker_params).softmax(-1)[0])
        if frame_index == codes.shape[0]:
            break
        frame = codes[frame_index]
        generated[0, frame[0]] = True
        inputs = torch.stack((hidden[:, -1], talker.embed_codec(frame[:1])), dim=1)
        positions = torch.tensor([[0, 1]])
        for codebook in range(1, 16):
            cp_logits = predictor(inputs, positions, list(cp_cache), head_index=codebook - 1)
            predictor_probs.append(warp(cp_logits.float(), predictor_params).softmax(-1)[0])
            inputs = predictor.embed(codebook, frame[codebook : codebook + 1])[:, None]
            positions = torch.tensor([[codebook + 1]])
        trailing = prompt.trailing_text_ids
        text_id = trailing[frame_index] if frame_index < len(trailing) else config.text_ids.tts_pad
        step_input = talker.embed_frame(frame[None]) + talker.embed_text(torch.tensor([text_id]))
        hidden, logits = talker(
            step_input[:, None], torch.tensor([[length + frame_index]]), list(cache), length + frame_index + 1
        )
    return torch.stack(code0_probs), torch.stack(predictor_probs)


@pytest.mark.parametrize("name", SAMPLED_CASES)
def test_sampled_probabilities_match_reference_teacher_forced(reference, tiny_loaded, name):
    expected = reference[("sampled", name)]
    codes = expected["0"]
    voice = next(case.voice for case in _cases() if case.name == name)
    with torch.no_grad():
        code0_probs, predictor_probs = _teacher_forced_probabilities(tiny_loaded, voice, codes, SAMPLED)
    expected_code0 = expected["scores0"][:, 0].softmax(-1)[: len(code0_probs)]
    expected_predictor = expected["scores_cp"][:, 0].softmax(-1)[: len(predictor_probs)]
    assert len(expected_code0) == len(code0_probs) and len(expected_predictor) == len(predictor_probs)
    torch.testing.assert_close(code0_probs, expected_code0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(predictor_probs, expected_predictor, atol=1e-5, rtol=1e-4)
    # The filters really cut: top-k / top-p leave only a few candidates per step.
    assert (code0_probs > 0).sum(-1).max() <= 40 and (predictor_probs > 0).sum(-1).max() <= 30


def test_speaker_encoder_matches_reference(reference, tiny_loaded):
    engine = TalkerEngine(tiny_loaded, EngineConfig(max_streams=1, max_positions=64, use_cuda_graphs=False))
    ours = engine.runner.speaker_vector(_speaker_audio())
    expected = reference["speaker_embedding"]
    assert ours.shape == expected.shape == (64,)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)
