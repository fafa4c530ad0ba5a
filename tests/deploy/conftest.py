"""Fixtures of the deployment tests: the Helm binary, rendered charts, the settings each process reads."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import yaml
from deploy_support import CHART, NAMESPACE, RELEASE, find_helm, run_helm, values_args

from chorus.runtime.config import env_name
from chorus.services import SERVICES


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.skip("helm not found: run `bash deploy/tools/install-helm.sh` (make test does) or set CHORUS_HELM")
    return path


@pytest.fixture(scope="session")
def render(helm):
    """render(values_set, *overrides) -> the manifests `helm template` prints, as dicts (cached)."""

    @functools.cache
    def _render(values_set: str, *overrides: str) -> tuple[dict, ...]:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args(values_set, overrides)]
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stderr
        return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)

    return _render


@pytest.fixture(scope="session")
def config_env_names() -> dict[str, frozenset[str]]:
    """Every CHORUS_<SERVICE>_<FIELD> variable each process reads, from its config dataclass."""
    names = {}
    for service, entry in SERVICES.items():
        config_cls = entry.load_config_class()
        names[service] = frozenset(env_name(config_cls, field) for field in dataclasses.fields(config_cls))
    return names
