"""What `chorus up` gives its gateway by default: more workers where the talker runs on CUDA, what the user sets
winning (the admission limits those workers derive: tests/gateway/test_capacity.py)."""

from __future__ import annotations

import os

from chorus.stack import CUDA_GATEWAY_WORKERS, LocalStack, StackPorts, gateway_workers, torch_gpu_count

CORES = len(os.sched_getaffinity(0))


def has_cuda(env) -> bool:
    return True  # a machine with a GPU, as torch would say


def has_no_cuda(env) -> bool:
    return False


def test_a_talker_on_cuda_gets_several_gateway_workers():
    on_cuda = min(CUDA_GATEWAY_WORKERS, CORES)
    assert gateway_workers({}, has_cuda) == on_cuda  # device auto, where torch finds a GPU
    assert gateway_workers({"CHORUS_TALKER_DEVICE": "cuda:1"}, has_no_cuda) == on_cuda
    assert gateway_workers({}, has_no_cuda) is None  # the gateway's default: 1
    assert gateway_workers({"CHORUS_TALKER_DEVICE": "cpu"}, has_cuda) is None


def test_what_the_user_sets_wins():
    assert gateway_workers({"CHORUS_GATEWAY_WORKERS": "1"}, has_cuda) is None
    stack = LocalStack(
        StackPorts.choose(0, 0),
        redis_url="redis://127.0.0.1:1/0",
        extra_env={"CHORUS_GATEWAY_WORKERS": "2", "CHORUS_TALKER_DEVICE": "cuda"},
    )
    assert stack._env_for("gateway")["CHORUS_GATEWAY_WORKERS"] == "2"
    # A talker setting the talker rejects leaves the gateway at its default; the talker reports the error.
    assert gateway_workers({"CHORUS_TALKER_MAX_STREAMS": "many"}, has_cuda) is None


def test_the_stack_decides_once_and_says_so():
    lines = []
    stack = LocalStack(
        StackPorts.choose(0, 0),
        redis_url="redis://127.0.0.1:1/0",
        log=lines.append,
        gpu_count=lambda env: 1,
        speech_in_one_process=False,
    )
    for _ in range(2):  # a restarted gateway gets the same number
        assert stack._env_for("gateway")["CHORUS_GATEWAY_WORKERS"] == str(min(CUDA_GATEWAY_WORKERS, CORES))
    assert lines == [f"the talker runs on CUDA: {min(CUDA_GATEWAY_WORKERS, CORES)} gateway workers "
                     "(CHORUS_GATEWAY_WORKERS sets another number)"]  # fmt: skip
    assert "CHORUS_GATEWAY_WORKERS" not in stack._env_for("talker")


def test_torch_answers_in_a_child_process():
    import torch

    assert torch_gpu_count(os.environ) == torch.cuda.device_count()
    assert torch_gpu_count(os.environ | {"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_each_model_process_sees_the_gpus_its_setting_names():
    gpus = {"CHORUS_TALKER_GPU": "0", "CHORUS_VOCODER_GPU": "1", "CHORUS_DIFFUSION_GPU": "2,3"}
    stack = LocalStack(StackPorts.choose(0, 0), redis_url="redis://127.0.0.1:1/0", extra_env=gpus)
    assert [stack._env_for(name)["CUDA_VISIBLE_DEVICES"] for name in ("talker", "vocoder", "diffusion")] == [
        "0",
        "1",
        "2,3",
    ]
    assert stack._env_for("gateway").get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    one_process = LocalStack(
        StackPorts.choose(0, 0),
        redis_url="redis://127.0.0.1:1/0",
        extra_env={"CHORUS_TALKER_GPU": "1"},
        speech_in_one_process=True,
    )
    assert one_process._env_for("speech")["CUDA_VISIBLE_DEVICES"] == "1"


def _stack(gpus: int, one_process: bool | None = None, log=lambda line: None, **env: str) -> LocalStack:
    return LocalStack(
        StackPorts.choose(0, 0),
        redis_url="redis://127.0.0.1:1/0",
        extra_env=env,
        speech_in_one_process=one_process,
        gpu_count=lambda env: gpus,
        log=log,
    )


def _placement(stack: LocalStack) -> dict[str, str | None]:
    return {name: stack._env_for(name).get("CUDA_VISIBLE_DEVICES") for name in stack.backend_processes}


def test_with_two_gpus_or_more_the_talker_gets_one_to_itself(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lines = []
    stack = _stack(2, log=lines.append)
    assert _placement(stack) == {"talker": "0", "vocoder": "1", "diffusion": "1"}
    assert _placement(stack) == {"talker": "0", "vocoder": "1", "diffusion": "1"}  # decided once, said once
    assert lines == ["2 GPUs: talker on 0, vocoder on 1, diffusion on 1 (CHORUS_TALKER_GPU, CHORUS_VOCODER_GPU, "
                     "CHORUS_DIFFUSION_GPU place them otherwise)"]  # fmt: skip
    assert _placement(_stack(3)) == {"talker": "0", "vocoder": "1", "diffusion": "2"}
    # A parallel DiT keeps every GPU; indices are those the stack was given.
    assert _placement(_stack(3, CHORUS_DIFFUSION_PARALLEL="cfg")) == {"talker": "0", "vocoder": "1", "diffusion": None}
    assert _placement(_stack(2, CUDA_VISIBLE_DEVICES="4,6")) == {"talker": "4", "vocoder": "6", "diffusion": "6"}


def test_on_one_gpu_talker_and_vocoder_share_a_process(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lines = []
    one_gpu = _stack(1, log=lines.append)
    assert _placement(one_gpu) == {"speech": None, "diffusion": None}
    assert one_gpu.backend_port("vocoder") == one_gpu.backend_port("talker") != one_gpu.backend_port("diffusion")
    assert lines == ["1 GPU: talker and vocoder in one process (--no-speech-in-one-process runs them apart)"]
    # Apart where asked, where no GPU is seen, or where their GPUs are named; together where asked, on any count.
    assert _placement(_stack(1, one_process=False)) == dict.fromkeys(("talker", "vocoder", "diffusion"))
    assert _placement(_stack(0)) == dict.fromkeys(("talker", "vocoder", "diffusion"))
    assert _placement(_stack(1, CHORUS_VOCODER_GPU="0")) == {"talker": None, "vocoder": "0", "diffusion": None}
    assert _placement(_stack(2, one_process=True)) == {"speech": None, "diffusion": None}


def test_one_process_cannot_take_two_gpus(monkeypatch, capsys):
    from chorus.cli import main

    monkeypatch.setenv("CHORUS_TALKER_GPU", "0")
    monkeypatch.setenv("CHORUS_VOCODER_GPU", "1")
    assert main(["up", "--speech-in-one-process"]) == 2
    assert "drop that flag to give each its own GPU" in capsys.readouterr().err
