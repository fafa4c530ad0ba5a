"""The Helm chart: `helm lint --strict`, rendered manifests against Kubernetes' schemas, and the
deployment contracts (gRPC probes, drain timing, GPUs, load balancing, secrets) checked on them."""

from __future__ import annotations

import pytest
from deploy_support import CHART, NAMESPACE, PENDING_ENV, RELEASE, VALUES_SETS, run_helm, values_args

from chorus.gateway.state.redis_url import parse_sentinel_url
from chorus.services import SERVICES

FULLNAME = f"{RELEASE}-chorus"
MODEL_SERVICES = ("talker", "vocoder", "diffusion")
#: The chart's oldest supported release (GA gRPC probes) and the newest kubernetes-validate 1.37 ships.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
#: Custom resources the chart may render; kubernetes-validate has only built-in kinds.
CRD_API_VERSIONS = {"ServiceMonitor": "monitoring.coreos.com/v1"}


def by_kind(docs, kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env_values(deployment: dict) -> dict[str, str | dict]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container(deployment)["env"]}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_lint_strict(helm, values_set):
    result = run_helm(helm, "lint", "--strict", str(CHART), *values_args(values_set))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def kubernetes_validate():
    return pytest.importorskip("kubernetes_validate", reason="needs the kubernetes-validate package (dev extra)")


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_manifests_match_kubernetes_schemas(render, kubernetes_validate, values_set, kubernetes_version):
    docs = render(values_set)
    assert docs
    for doc in docs:
        if doc["kind"] in CRD_API_VERSIONS:
            assert doc["apiVersion"] == CRD_API_VERSIONS[doc["kind"]]
            continue
        try:
            kubernetes_validate.validate(doc, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = f"{doc['kind']}/{doc['metadata']['name']} at {exc.json_path}"
            pytest.fail(f"{where} is invalid on Kubernetes {kubernetes_version}: {exc.message}")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("talker.replicas=two", "replicas"),
        ("talker.settings.port=1", "port"),
        ("drain.graceSeconds=0", "graceSeconds"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("gateway.apiKeys.keys={a\\,b}", "keys"),
        ("externalRedis.url=http://redis:6379", "url"),
    ],
)
def test_values_schema_rejects_bad_values(helm, override, message):
    result = run_helm(helm, "lint", "--strict", str(CHART), "--set", override)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_external_redis_needs_an_address(helm):
    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", "redis.enabled=false")
    assert result.returncode != 0
    assert "externalRedis.url or externalRedis.existingSecret" in result.stderr


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_model_services_probe_their_grpc_health_service(render, values_set):
    deployments = by_kind(render(values_set), "Deployment")
    for service in MODEL_SERVICES:
        main = container(deployments[f"{FULLNAME}-{service}"])
        (grpc_port,) = [port["containerPort"] for port in main["ports"] if port["name"] == "grpc"]
        assert env_values(deployments[f"{FULLNAME}-{service}"])[f"CHORUS_{service.upper()}_PORT"] == str(grpc_port)
        for probe in ("startupProbe", "readinessProbe"):
            assert main[probe]["grpc"] == {"port": grpc_port, "service": SERVICES[service].grpc_service}
        assert main["livenessProbe"]["grpc"] == {"port": grpc_port, "service": ""}
        startup = main["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "model warm-up needs minutes"


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_gateway_reaches_every_model_pod_through_a_headless_service(render, values_set):
    docs = render(values_set)
    services, deployments = by_kind(docs, "Service"), by_kind(docs, "Deployment")
    gateway_env = env_values(deployments[f"{FULLNAME}-gateway"])
    for service in MODEL_SERVICES:
        svc = services[f"{FULLNAME}-{service}"]
        pod_labels = deployments[f"{FULLNAME}-{service}"]["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["clusterIP"] == "None"
        assert selects(svc["spec"]["selector"], pod_labels)
        (grpc_port,) = [port["port"] for port in svc["spec"]["ports"] if port["name"] == "grpc"]
        expected = f"dns:///{FULLNAME}-{service}.{NAMESPACE}.svc.cluster.local:{grpc_port}"
        assert gateway_env[f"CHORUS_GATEWAY_{service.upper()}_TARGETS"] == expected


def drain_timing(deployment: dict) -> tuple[float, int, int]:
    """(grace_s the process reads, preStop sleep, terminationGracePeriodSeconds) of a Deployment."""
    service = deployment["metadata"]["name"].removeprefix(f"{FULLNAME}-")
    grace_s = float(env_values(deployment)[f"CHORUS_{service.upper()}_GRACE_S"])
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    return grace_s, int(pre_stop[1]), deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def probe_window_s(probe: dict) -> int:
    """How long a probe fails before Kubernetes acts on it."""
    return probe["periodSeconds"] * probe["failureThreshold"]


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_pods_outlive_their_drain(render, values_set):
    for name, deployment in by_kind(render(values_set), "Deployment").items():
        grace_s, pre_stop_s, termination_s = drain_timing(deployment)
        assert pre_stop_s > 0
        assert termination_s >= pre_stop_s + grace_s + 5, f"{name}: no margin to exit after the drain"


def test_drain_timing_is_derived_from_one_set_of_values(render):
    """The process's grace_s (the gateway's hand-over time) and the pod's kill deadline move together."""
    docs = render("default", "drain.graceSeconds=90", "drain.preStopSleepSeconds=3", "drain.exitMarginSeconds=7")
    for name, deployment in by_kind(docs, "Deployment").items():
        assert drain_timing(deployment) == (90.0, 3, 3 + 90 + 7), name


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_readiness_fails_fast_and_liveness_is_lenient(render, values_set):
    for name, deployment in by_kind(render(values_set), "Deployment").items():
        main = container(deployment)
        readiness, liveness = main["readinessProbe"], main["livenessProbe"]
        grace_s, _, _ = drain_timing(deployment)
        assert probe_window_s(readiness) < grace_s, f"{name}: a draining pod must leave rotation within its drain"
        assert probe_window_s(readiness) <= 10, f"{name}: readiness should notice a drain within seconds"
        assert probe_window_s(liveness) >= max(30, 3 * probe_window_s(readiness)), f"{name}: liveness too eager"
        if name.endswith("-gateway"):
            # /ready turns 503 while draining or while Redis or a backend is down; /health only if the process
            # does not answer: an outage of a dependency must not restart every gateway.
            assert readiness["httpGet"]["path"] == "/ready" and liveness["httpGet"]["path"] == "/health"
        else:
            assert liveness["grpc"]["service"] == "", f"{name}: liveness is the server's, not the model's status"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("probes.readiness.periodSeconds=20",), "must be shorter than drain.graceSeconds"),
        (("drain.graceSeconds=4",), "must be shorter than drain.graceSeconds"),
        (("probes.liveness.periodSeconds=2", "probes.liveness.failureThreshold=1"), "probes.liveness"),
        (("probes.readiness.failureThreshold=0",), "failureThreshold"),
    ],
)
def test_probe_timing_that_defeats_the_drain_is_refused(helm, overrides, message):
    result = run_helm(helm, "template", RELEASE, str(CHART), *values_args("default", overrides))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


@pytest.mark.parametrize(("values_set", "gpus"), [("default", 1), ("gpu-production", 1), ("cpu", 0)])
def test_model_services_request_gpus_only_when_enabled(render, values_set, gpus):
    deployments = by_kind(render(values_set), "Deployment")
    for service in MODEL_SERVICES:
        deployment = deployments[f"{FULLNAME}-{service}"]
        main, pod = container(deployment), deployment["spec"]["template"]["spec"]
        expected = gpus * (2 if values_set == "gpu-production" and service == "diffusion" else 1)
        resources = main["resources"]
        assert resources["limits"].get("nvidia.com/gpu", 0) == expected
        assert resources["requests"].get("nvidia.com/gpu", 0) == expected, "extended resources: request = limit"
        on_gpu = expected > 0
        assert env_values(deployment)[f"CHORUS_{service.upper()}_DEVICE"] == ("cuda" if on_gpu else "cpu")
        assert main["image"].endswith("-cuda" if on_gpu else "-cpu")
        assert any(t["key"] == "nvidia.com/gpu" for t in pod.get("tolerations", [])) == on_gpu
    assert container(deployments[f"{FULLNAME}-gateway"])["image"].endswith("-cpu")


def test_gpu_values_pin_nodes_runtime_and_checkpoints(render):
    deployments = by_kind(render("gpu-production"), "Deployment")
    for service in MODEL_SERVICES:
        pod = deployments[f"{FULLNAME}-{service}"]["spec"]["template"]["spec"]
        assert pod["runtimeClassName"] == "nvidia"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        (models,) = [volume for volume in pod["volumes"] if volume["name"] == "models"]
        assert models["persistentVolumeClaim"] == {"claimName": "chorus-models"}
    assert env_values(deployments[f"{FULLNAME}-talker"])["CHORUS_TALKER_MAX_STREAMS"] == "64"


@pytest.mark.parametrize(
    ("overrides", "volume"),
    [
        ((), {"emptyDir": {}}),
        (("compileCache.existingClaim=kernels",), {"persistentVolumeClaim": {"claimName": "kernels"}}),
    ],
)
def test_model_services_keep_their_compile_caches_on_a_volume(render, overrides, volume):
    for service in MODEL_SERVICES:
        deployment = by_kind(render("default", *overrides), "Deployment")[f"{FULLNAME}-{service}"]
        (mounted,) = [mount for mount in container(deployment)["volumeMounts"] if mount["name"] == "compile-cache"]
        env = env_values(deployment)
        for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            assert env[variable].startswith(mounted["mountPath"] + "/"), variable
        pod_volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"name": "compile-cache", **volume} in pod_volumes


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_env_vars_name_real_settings(render, values_set, config_env_names):
    known = frozenset().union(*config_env_names.values()) | PENDING_ENV
    for name, deployment in by_kind(render(values_set), "Deployment").items():
        chorus_vars = {var for var in env_values(deployment) if var.startswith("CHORUS_")}
        assert chorus_vars <= known, f"{name}: {sorted(chorus_vars - known)}"


@pytest.mark.parametrize("values_set", ["default", "gpu-production"])
def test_every_component_has_a_disruption_budget_and_an_autoscaler(render, values_set):
    docs = render(values_set)
    deployments, budgets = by_kind(docs, "Deployment"), by_kind(docs, "PodDisruptionBudget")
    autoscalers = by_kind(docs, "HorizontalPodAutoscaler")
    assert set(deployments) == set(budgets) == set(autoscalers)
    for name, deployment in deployments.items():
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(budgets[name]["spec"]["selector"]["matchLabels"], pod_labels)
        assert autoscalers[name]["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
        metric_types = [metric["type"] for metric in autoscalers[name]["spec"]["metrics"]]
        assert metric_types == (["Resource", "Pods"] if values_set == "gpu-production" else ["Resource"])


def test_cpu_values_fix_replicas_without_autoscalers(render):
    docs = render("cpu")
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    assert all(d["spec"]["replicas"] == 1 for d in by_kind(docs, "Deployment").values())


def test_api_keys_come_from_a_secret(render):
    chart_secret = by_kind(render("external-redis"), "Secret")[f"{FULLNAME}-api-keys"]
    assert chart_secret["stringData"] == {"api-keys": "ci-key-one,ci-key-two"}
    gateway = by_kind(render("external-redis"), "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_API_KEYS"] == {
        "secretKeyRef": {"name": f"{FULLNAME}-api-keys", "key": "api-keys"}
    }
    assert not by_kind(render("gpu-production"), "Secret"), "an existing Secret is referenced, not created"
    gateway = by_kind(render("gpu-production"), "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_API_KEYS"] == {
        "secretKeyRef": {"name": "chorus-api-keys", "key": "keys"}
    }
    assert "CHORUS_GATEWAY_API_KEYS" not in env_values(by_kind(render("default"), "Deployment")[f"{FULLNAME}-gateway"])


def test_redis_is_bundled_or_external(render):
    bundled = render("default")
    (statefulset,) = by_kind(bundled, "StatefulSet").values()
    redis_service = by_kind(bundled, "Service")[f"{FULLNAME}-redis"]
    assert statefulset["spec"]["serviceName"] == redis_service["metadata"]["name"]
    assert selects(redis_service["spec"]["selector"], statefulset["spec"]["template"]["metadata"]["labels"])
    gateway = by_kind(bundled, "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_REDIS_URL"] == f"redis://{FULLNAME}-redis:6379/0"

    external = render("external-redis")
    assert not by_kind(external, "StatefulSet")
    gateway = by_kind(external, "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_REDIS_URL"] == {"secretKeyRef": {"name": "chorus-redis", "key": "url"}}
    for persistence in ("false", "true"):  # saved voices live without a TTL: Redis writes an append-only file
        (redis,) = by_kind(render("default", f"redis.persistence.enabled={persistence}"), "StatefulSet").values()
        args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--appendonly") + 1] == "yes"
    url_values = render("default", "redis.enabled=false", "externalRedis.url=redis://cache:6379/2")
    gateway = by_kind(url_values, "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_REDIS_URL"] == "redis://cache:6379/2"


def test_sentinel_values_build_the_gateways_sentinel_url(render):
    gateway = by_kind(render("sentinel"), "Deployment")[f"{FULLNAME}-gateway"]
    assert not by_kind(render("sentinel"), "StatefulSet"), "no bundled Redis beside the Sentinels"
    names = [var["name"] for var in container(gateway)["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("CHORUS_GATEWAY_REDIS_URL"), "$(VAR) needs VAR first"
    env = env_values(gateway)
    assert env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "redis", "key": "redis-password"}}
    hosts = [f"redis-node-{i}.redis-headless.redis.svc.cluster.local:26379" for i in range(3)]
    url = env["CHORUS_GATEWAY_REDIS_URL"]
    assert url == (
        f"redis+sentinel://$(REDIS_PASSWORD)@{','.join(hosts)}/mymaster/0?sentinel_password=$(REDIS_PASSWORD)"
    )
    # What the gateway reads once Kubernetes has put the password in: a URL it accepts.
    address = parse_sentinel_url(url.replace("$(REDIS_PASSWORD)", "s3cret"))
    assert [f"{host}:{port}" for host, port in address.sentinels] == hosts
    assert (address.service_name, address.db, address.password, address.sentinel_password) == (
        "mymaster",
        0,
        "s3cret",
        "s3cret",
    )

    no_password = render(
        "default", "redis.enabled=false", "externalRedis.sentinel.enabled=true", "externalRedis.sentinel.hosts={s:1}"
    )
    env = env_values(by_kind(no_password, "Deployment")[f"{FULLNAME}-gateway"])
    assert env["CHORUS_GATEWAY_REDIS_URL"] == "redis+sentinel://s:1/mymaster/0" and "REDIS_PASSWORD" not in env


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("externalRedis.sentinel.enabled=true", "externalRedis.sentinel.hosts={s:1}"), "needs redis.enabled=false"),
        (("redis.enabled=false", "externalRedis.sentinel.enabled=true"), "list at least one Sentinel"),
        (("redis.enabled=false", "externalRedis.sentinel.enabled=true", "externalRedis.sentinel.hosts={a/b}"), "hosts"),
    ],
)
def test_bad_sentinel_values_are_refused(helm, overrides, message):
    result = run_helm(helm, "template", RELEASE, str(CHART), *values_args("default", overrides))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_gpu_values_expose_the_gateway_and_metrics(render):
    docs = render("gpu-production")
    (ingress,) = by_kind(docs, "Ingress").values()
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    gateway_service = by_kind(docs, "Service")[backend["name"]]
    assert backend["port"]["name"] in {port["name"] for port in gateway_service["spec"]["ports"]}
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]
    (component_rule,) = selector["matchExpressions"]
    assert component_rule["key"] == "app.kubernetes.io/component" and component_rule["operator"] == "In"
    scraped = [
        svc
        for svc in by_kind(docs, "Service").values()
        if selects(selector["matchLabels"], svc["metadata"]["labels"])
        and svc["metadata"]["labels"][component_rule["key"]] in component_rule["values"]
    ]
    assert {svc["metadata"]["labels"]["app.kubernetes.io/component"] for svc in scraped} == {"gateway", *MODEL_SERVICES}
    (endpoint,) = monitor["spec"]["endpoints"]
    for svc in scraped:
        assert endpoint["port"] in {port["name"] for port in svc["spec"]["ports"]}


def test_disabling_a_model_service_leaves_its_targets_empty(render):
    docs = render("default", "diffusion.enabled=false")
    assert f"{FULLNAME}-diffusion" not in by_kind(docs, "Deployment")
    assert f"{FULLNAME}-diffusion" not in by_kind(docs, "HorizontalPodAutoscaler")
    gateway = by_kind(docs, "Deployment")[f"{FULLNAME}-gateway"]
    assert env_values(gateway)["CHORUS_GATEWAY_DIFFUSION_TARGETS"] == ""


@pytest.mark.parametrize(("values_set", "parallel", "gpus"), [("gpu-production", "cfg", 2), ("multi-gpu", "cfg+tp", 4)])
def test_parallel_diffusion_gets_its_gpus_mode_and_nccl_env(render, values_set, parallel, gpus):
    diffusion = by_kind(render(values_set), "Deployment")[f"{FULLNAME}-diffusion"]
    env = env_values(diffusion)
    assert env["CHORUS_DIFFUSION_PARALLEL"] == parallel
    assert env["CHORUS_DIFFUSION_PARALLEL_DEGREE"] == str(gpus)
    assert env["NCCL_NVLS_ENABLE"] == "0", "the worker ranks inherit the pod's environment"
    assert container(diffusion)["resources"]["limits"]["nvidia.com/gpu"] == gpus


def test_single_gpu_diffusion_sets_no_parallel_mode(render):
    env = env_values(by_kind(render("default"), "Deployment")[f"{FULLNAME}-diffusion"])
    assert "CHORUS_DIFFUSION_PARALLEL" not in env and env["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("diffusion.parallel=tp", "diffusion.gpus=1"), "needs gpus >= 2"),
        (("talker.parallel=tp", "talker.gpus=2"), "only diffusion"),
        (("diffusion.parallel=ring",), "parallel"),
        (("diffusion.ncclEnv.CUDA_VISIBLE_DEVICES=0",), "ncclEnv"),
    ],
)
def test_bad_parallel_values_are_refused(helm, overrides, message):
    result = run_helm(helm, "template", RELEASE, str(CHART), *values_args("default", overrides))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
