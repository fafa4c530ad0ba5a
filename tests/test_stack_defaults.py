"""What `chorus up` gives its gateway by default: more workers where the talker runs on CUDA, what the user sets
winning (the admission limits those workers derive: tests/gateway/test_capacity.py)."""

from __future__ import annotations

import os

from chorus.stack import CUDA_GATEWAY_WORKERS, LocalStack, StackPorts, gateway_workers, torch_sees_cuda

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
        StackPorts.choose(0, 0), redis_url="redis://127.0.0.1:1/0", log=lines.append, cuda_available=has_cuda
    )
    for _ in range(2):  # a restarted gateway gets the same number
        assert stack._env_for("gateway")["CHORUS_GATEWAY_WORKERS"] == str(min(CUDA_GATEWAY_WORKERS, CORES))
    assert lines == [f"the talker runs on CUDA: {min(CUDA_GATEWAY_WORKERS, CORES)} gateway workers "
                     "(CHORUS_GATEWAY_WORKERS sets another number)"]  # fmt: skip
    assert "CHORUS_GATEWAY_WORKERS" not in stack._env_for("talker")


def test_torch_answers_in_a_child_process():
    import torch

    assert torch_sees_cuda(os.environ) == torch.cuda.is_available()
    assert torch_sees_cuda(os.environ | {"CUDA_VISIBLE_DEVICES": ""}) is False


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


def test_the_gateway_workers_follow_the_talkers_gpu():
    def cuda_on_gpu_1_only(env) -> bool:
        return env.get("CUDA_VISIBLE_DEVICES") == "1"

    for talker_gpu, on_cuda in (("1", True), ("0", False)):
        stack = LocalStack(
            StackPorts.choose(0, 0),
            redis_url="redis://127.0.0.1:1/0",
            extra_env={"CHORUS_TALKER_GPU": talker_gpu, "CHORUS_VOCODER_GPU": "0"},
            cuda_available=cuda_on_gpu_1_only,
            log=lambda line: None,
        )
        workers = stack._env_for("gateway").get("CHORUS_GATEWAY_WORKERS")
        assert (workers == str(min(CUDA_GATEWAY_WORKERS, CORES))) == on_cuda


def test_one_process_cannot_take_two_gpus(monkeypatch, capsys):
    from chorus.cli import main

    monkeypatch.setenv("CHORUS_TALKER_GPU", "0")
    monkeypatch.setenv("CHORUS_VOCODER_GPU", "1")
    assert main(["up", "--speech-in-one-process"]) == 2
    assert "drop that flag to give each its own GPU" in capsys.readouterr().err
