"""Shared fixtures: a real local Redis, and the `gpu` marker's skip rule."""

from __future__ import annotations

import os

# Tests fork service processes (subprocess with preexec_fn) while this process runs gRPC threads; gRPC's fork
# handlers then run half-way in the child, which once aborted (SIGABRT, "epoll_wait error: Bad file descriptor")
# before its exec. The children exec at once and need none of this process's gRPC state. Set before grpc loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest
import torch

# Without CUDA the Triton kernels' tests run in Triton's interpreter, which `triton.jit` picks when it decorates a
# function, triton's own library included: set before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from _pytest.tmpdir import tmppath_result_key

from chorus.runtime.redis_server import start_local_redis


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # pytest's tmp_path teardown reads a per-test key set only once a setup report exists. When a run is cut
    # short during a fixture's setup, the session teardown then raised KeyError over the real cause, which
    # CI's log tail lost (an interrupted run once ended in that traceback alone). An empty entry keeps the
    # cause and the summary last.
    item.stash.setdefault(tmppath_result_key, {})


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """A real redis-server on a free loopback port for the whole test session."""
    server = start_local_redis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()
