"""deploy/k8s: both overlays render with `kubectl kustomize` (offline, built into kubectl) and pass
the Kubernetes JSON schemas (kubernetes-validate, strict, schemas vendored in the package); then
structural checks: kinds, selectors that match their pods, probes, graceful termination, GPUs,
NetworkPolicies that admit only the gateway to the engines and Redis, and locked-down pods."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.settings import parse_settings
from tests.deploy.manifests import OVERLAYS, by_kind, kustomize, pod_templates

pytestmark = pytest.mark.processes

K8S_VERSION = "1.30.0"  # the oldest version the manifests promise (HPA v2 behavior, PDB v1)
GATEWAY_LABELS = {"app.kubernetes.io/name": "llm-gateway", "app.kubernetes.io/component": "gateway"}

#: the secret the `gateway-secrets` Secret hands the gateway: the config refuses to start without one
SECRET_ENV = {"GATEWAY_JWT_SECRET": "s" * 32}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def docs(overlay: str) -> tuple[dict[str, Any], ...]:
    return kustomize(overlay)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _gateway(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return by_kind(docs, "Deployment")["llm-gateway"]


def _container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def test_schema_valid(docs: tuple[dict[str, Any], ...]) -> None:
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema vendored; checked structurally below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 15


def test_schema_validation_is_not_a_no_op(docs: tuple[dict[str, Any], ...]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(_gateway(docs)))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kinds(overlay: str, docs: tuple[dict[str, Any], ...]) -> None:
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ConfigMap",
        "NetworkPolicy",
        "StatefulSet",
        "ServiceAccount",
    } <= kinds
    assert set(by_kind(docs, "StatefulSet")) == {"redis", "vllm", "sglang"}
    assert {"llm-gateway", "redis", "vllm", "sglang"} <= set(by_kind(docs, "Service"))
    if overlay == "sim":
        assert "Secret" in kinds
    else:
        assert set(by_kind(docs, "ServiceMonitor")) == {"llm-gateway", "engines"}
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert namespaces == {next(iter(by_kind(docs, "Namespace")))}


def test_selectors_match_their_pods(docs: tuple[dict[str, Any], ...]) -> None:
    pods = {name: t["metadata"]["labels"] for name, t in pod_templates(docs)}
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("Deployment", "StatefulSet"):
            assert _selects(d["spec"]["selector"]["matchLabels"], pods[f"{kind}/{name}"]), name
        if kind == "StatefulSet":
            service = by_kind(docs, "Service")[d["spec"]["serviceName"]]
            assert service["spec"].get("clusterIP") == "None" or name == "redis"
        if kind in ("Service", "PodDisruptionBudget") or kind == "ServiceMonitor":
            selector = d["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert any(_selects(selector, labels) for labels in pods.values()), (
                f"{kind}/{name} selects nothing"
            )
        if kind == "HorizontalPodAutoscaler":
            target = d["spec"]["scaleTargetRef"]
            assert f"{target['kind']}/{target['name']}" in pods
    # Services' named target ports exist on the pods they select
    for name, service in by_kind(docs, "Service").items():
        for _, template in pod_templates(docs):
            if _selects(service["spec"]["selector"], template["metadata"]["labels"]):
                port_names = {
                    p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])
                }
                for port in service["spec"]["ports"]:
                    assert port["targetPort"] in port_names, (name, port)


def test_gateway_probes_and_graceful_termination(docs: tuple[dict[str, Any], ...]) -> None:
    gateway = _gateway(docs)
    spec = gateway["spec"]["template"]["spec"]
    c = _container(gateway, "gateway")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep_s = int(pre_stop[1])
    assert sleep_s >= 5
    configmap = next(iter(by_kind(docs, "ConfigMap").values()))
    settings = parse_settings(yaml.safe_load(configmap["data"]["gateway.yaml"]), SECRET_ENV)
    # the grace period covers the preStop sleep plus the whole stream drain
    assert spec["terminationGracePeriodSeconds"] > sleep_s + settings.server.graceful_shutdown_s
    assert "replicas" not in gateway["spec"], "the HPA owns the replica count"
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # the config mounted where the command reads it, and the ConfigMap is the generated one
    assert c["args"] == ["serve", "--config", "/etc/gateway/gateway.yaml"]
    (config_volume,) = [v for v in spec["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert settings.server.port == 8080 and settings.redis.configured


def test_gateway_config_reaches_the_engine_pods(docs: tuple[dict[str, Any], ...]) -> None:
    configmap = next(iter(by_kind(docs, "ConfigMap").values()))
    settings = parse_settings(yaml.safe_load(configmap["data"]["gateway.yaml"]), SECRET_ENV)
    statefulsets = by_kind(docs, "StatefulSet")
    services = by_kind(docs, "Service")
    for pool in settings.pools:
        for backend in pool.backends:
            host, port = backend.url.removeprefix("http://").split(":")
            pod, service = host.split(".")
            sts_name, ordinal = pod.rsplit("-", 1)
            sts = statefulsets[sts_name]
            assert sts["spec"]["serviceName"] == service
            assert int(ordinal) < sts["spec"]["replicas"], backend.url
            assert int(port) in {p["port"] for p in services[service]["spec"]["ports"]}
            assert pool.dialect == sts_name


def test_hpa_and_pdb(docs: tuple[dict[str, Any], ...]) -> None:
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60
    (pdb,) = by_kind(docs, "PodDisruptionBudget").values()
    assert pdb["spec"]["selector"]["matchLabels"] == GATEWAY_LABELS
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable", 0) >= 1


def test_engines(overlay: str, docs: tuple[dict[str, Any], ...]) -> None:
    for name, port in (("vllm", 8000), ("sglang", 30000)):
        sts = by_kind(docs, "StatefulSet")[name]
        c = _container(sts)
        argv = [*c.get("command", []), *c.get("args", [])]
        assert any(p["containerPort"] == port for p in c["ports"])
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(
            port
        )
        if overlay == "gpu":
            assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
            image = c["image"].split(":")[0]
            assert image == {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}[name]
            flags = {
                "vllm": ["--enable-prefix-caching", "--enable-auto-tool-choice", "--tool-call-parser=hermes"],
                "sglang": ["--enable-metrics", "--tool-call-parser=qwen25"],
            }[name]
            assert set(flags) <= set(argv), argv
            (kv,) = [a for a in argv if a.startswith("--kv-events-config=")]
            assert '"endpoint":"tcp://*:5557"' in kv and '"publisher":"zmq"' in kv
            assert {p["containerPort"] for p in c["ports"]} >= {5557, 5558}
            assert (
                c.get("startupProbe", {}).get("failureThreshold", 0) * c["startupProbe"]["periodSeconds"]
                >= 600
            )
        else:
            assert "nvidia.com/gpu" not in str(c["resources"])
            assert argv[:3] == ["sim", "--engine", name]


def _policy_for(docs: tuple[dict[str, Any], ...], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        p
        for p in by_kind(docs, "NetworkPolicy").values()
        if _selects(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]


def test_network_policies(docs: tuple[dict[str, Any], ...]) -> None:
    policies = by_kind(docs, "NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
    for target in ("vllm", "sglang", "redis"):
        labels = by_kind(docs, "StatefulSet")[target]["spec"]["template"]["metadata"]["labels"]
        applying = [p for p in _policy_for(docs, labels) if p["spec"]["podSelector"]]
        assert applying, f"no NetworkPolicy selects {target}"
        for policy in applying:
            for rule in policy["spec"]["ingress"]:
                assert rule.get("from"), f"{policy['metadata']['name']}: a rule open to everyone"
                for peer in rule["from"]:
                    assert "ipBlock" not in peer
                    pod = peer.get("podSelector", {}).get("matchLabels", {})
                    if "namespaceSelector" in peer:  # Prometheus, in its own namespace
                        assert target != "redis"
                        assert pod.get("app.kubernetes.io/name") == "prometheus"
                    else:
                        assert pod == GATEWAY_LABELS, (target, pod)
    # the gateway's processes subscribe to the engines' KV events (5557) and ask for replays (5558)
    (engines,) = [p for p in policies.values() if p["metadata"]["name"] == "engines-ingress"]
    from_gateway = [
        r
        for r in engines["spec"]["ingress"]
        if r["from"][0].get("podSelector", {}).get("matchLabels") == GATEWAY_LABELS
    ]
    assert {5557, 5558} <= {p["port"] for r in from_gateway for p in r["ports"]}
    # and the gateway pods carry exactly the labels those policies admit
    assert _selects(GATEWAY_LABELS, _gateway(docs)["spec"]["template"]["metadata"]["labels"])


def test_pods_are_locked_down(docs: tuple[dict[str, Any], ...]) -> None:
    for name, template in pod_templates(docs):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"].get("runAsUser", 0) != 0, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"]["requests"], f"{name}: no resource requests"
            # only the GPU engines write into their image (torch / triton caches); all else is read-only
            if not c["image"].startswith(("vllm/vllm-openai", "lmsysorg/sglang")):
                assert sc["readOnlyRootFilesystem"] is True, name


def test_secrets_are_not_in_the_gpu_overlay() -> None:
    docs = kustomize("gpu")
    assert not by_kind(docs, "Secret"), "production secrets are created out of band, never committed"
    env_from = _container(_gateway(docs))["envFrom"]
    assert {"secretRef": {"name": "gateway-secrets"}} in env_from
