"""`bench/pyspy_threads.py` sums py-spy's raw stacks per thread: samples, share, and the functions on each thread's
stack counted once per sample however deep they recur."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("pyspy_threads", REPO / "bench" / "pyspy_threads.py")
pyspy_threads = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pyspy_threads)

START = "_bootstrap (threading.py:1);run (threading.py:2)"  # how every thread's stack begins
RAW = (
    f"thread (1): talker-engine;{START};step (engine.py:10);run (prefill.py:9);f (a.py:1);f (a.py:1) 6\n"
    f"thread (1): talker-engine;{START};step (engine.py:10);wait (threading.py:3) 2\n"
    "thread (2): MainThread;main (cli.py:5);poll (loop.py:7) 2\n"
)


def test_samples_are_summed_per_thread_with_each_function_counted_once_a_sample(tmp_path):
    threads = pyspy_threads.per_thread(RAW.splitlines())
    engine_samples, engine_functions = threads["thread (1): talker-engine"]
    assert engine_samples == 8 and threads["thread (2): MainThread"][0] == 2
    assert engine_functions["step (engine.py:10)"] == 8
    assert engine_functions["f (a.py:1)"] == 6  # recursion: once per sample
    assert engine_functions["wait (threading.py:3)"] == 2
    path = tmp_path / "raw.txt"
    path.write_text(RAW)
    text = pyspy_threads.summary(path, top=3)
    lines = text.splitlines()
    assert lines[0] == "raw.txt: 10 samples"
    assert lines[1].split()[:2] == ["80.0", "%"] and lines[1].endswith("talker-engine")
    assert "threading.py:1" not in text and "threading.py:2" not in text  # how every thread starts: left out
    assert "100.0 %  step (engine.py:10)" in lines[2] and "75.0 %  run (prefill.py:9)" in text
