"""Paths and helpers of the deployment tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "k8s" / "chorus"
NAMESPACE = "chorus-test"
RELEASE = "ci"
#: Values files of the CI matrix, by name ("default" is the chart's own values.yaml). No id is plain "gpu":
#: pytest would read it as the `gpu` marker and skip the test without CUDA.
VALUES_SETS = {
    "default": (),
    "gpu-production": (CHART / "ci" / "gpu-values.yaml",),
    "external-redis": (CHART / "ci" / "external-redis-values.yaml",),
    "sentinel": (CHART / "ci" / "sentinel-values.yaml",),
    "cpu": (CHART / "ci" / "cpu-values.yaml",),
    "multi-gpu": (CHART / "ci" / "multigpu-values.yaml",),
}
#: Variables the deploy files set for settings another engineer is adding to the gateway.
PENDING_ENV = frozenset({"CHORUS_GATEWAY_API_KEYS"})


def find_helm() -> str | None:
    for candidate in (os.environ.get("CHORUS_HELM"), str(REPO / ".tools" / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    # Private cache/config dirs: no repository index or plugin of the user's leaks into the result.
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/chorus-helm-cache", "HELM_CONFIG_HOME": "/tmp/chorus-helm-config"}
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def values_args(values_set: str, overrides: tuple[str, ...] = ()) -> list[str]:
    args = [arg for path in VALUES_SETS[values_set] for arg in ("-f", str(path))]
    return args + [arg for override in overrides for arg in ("--set", override)]


def dockerfile_env(path: Path) -> dict[str, str]:
    """The KEY=VALUE pairs of a Dockerfile's ENV instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line.removeprefix("ENV ")):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


class Reset(dict):
    """A mapping tagged `!reset` in a Compose file: the merge removes the key instead of merging it."""


class ComposeLoader(yaml.SafeLoader):
    """Reads Compose YAML, including its `!reset` tag on mappings."""


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset(loader.construct_mapping(node, deep=True)))

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def interpolate(value, environ: dict[str, str]):
    """Compose's ${VAR} / ${VAR:-default} substitution, applied to every string of a loaded file."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: environ.get(m["name"]) or (m["default"] or ""), value)
    if isinstance(value, dict):
        interpolated = {key: interpolate(item, environ) for key, item in value.items()}
        return Reset(interpolated) if isinstance(value, Reset) else interpolated
    if isinstance(value, list):
        return [interpolate(item, environ) for item in value]
    return value


def load_compose(name: str, environ: dict[str, str] | None = None) -> dict:
    with open(REPO / name) as stream:
        return interpolate(yaml.load(stream, Loader=ComposeLoader), environ or {})


REPLACED_LISTS = {"command", "entrypoint"}  # lists an override replaces whole, in Compose's merge


def merge_compose(base: dict, override: dict) -> dict:
    """Compose's override merge for mappings and scalars (`!reset` removes); lists are not merged."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Reset):
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_compose(merged[key], value)
        else:
            assert not isinstance(value, list) or key in REPLACED_LISTS, f"list merge of {key!r} is not modelled"
            merged[key] = value
    return merged
