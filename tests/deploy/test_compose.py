"""deploy/compose/compose.yaml, checked structurally (`docker compose config` needs the compose
plugin and a daemon, neither of which exists here): services, profiles, images and GPU
reservations, healthchecks, the two gateway replicas behind nginx, networks that keep the engines
and Redis private, the mounts of deploy/prometheus and deploy/grafana, and nginx's streaming
settings."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from gateway.settings import load_settings
from tests.deploy.manifests import COMPOSE_DIR, compose

DOC = compose()
SERVICES: dict[str, dict[str, Any]] = DOC["services"]
GPU_ENGINES = {"vllm", "sglang"}

#: the secret compose hands the gateway (`GATEWAY_JWT_SECRET`): the configs refuse to start without one
SECRET_ENV = {"GATEWAY_JWT_SECRET": "s" * 32}


def profiles(name: str) -> list[str]:
    return list(SERVICES[name].get("profiles", []))


def active(profile: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile <profile> up` starts."""
    return {n: s for n, s in SERVICES.items() if not s.get("profiles") or profile in s["profiles"]}


def networks(name: str) -> set[str]:
    return set(SERVICES[name].get("networks", ["default"]))  # a list, or a mapping keyed by network


def command(name: str) -> list[str]:
    cmd = SERVICES[name].get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def has_gpu(service: dict[str, Any]) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return any("gpu" in d.get("capabilities", []) for d in devices)


def test_services_and_profiles() -> None:
    always = {"nginx", "gateway", "redis", "prometheus", "grafana"}
    assert always <= set(SERVICES)
    for name in always:
        assert not profiles(name), f"{name} should run in every profile"
    for name in GPU_ENGINES:
        assert profiles(name) == ["gpu"]
    sims = [n for n in SERVICES if "sim" in profiles(n)]
    assert {c for n in sims for c in command(n) if c in ("vllm", "sglang")} == {"vllm", "sglang"}
    assert len(sims) >= 4  # two of each dialect


def test_sim_profile_runs_on_any_machine() -> None:
    sim = active("sim")
    assert not GPU_ENGINES & set(sim)
    for name, service in sim.items():
        assert not has_gpu(service), f"{name} reserves a GPU in the sim profile"
        if name.startswith("sim-"):
            assert command(name)[0] == "sim", name
            assert service["image"] == SERVICES["gateway"]["image"], "simulators run the gateway image"


def test_gpu_engines_reserve_gpus_and_use_the_official_images() -> None:
    assert SERVICES["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert SERVICES["sglang"]["image"].startswith("lmsysorg/sglang:")
    ids = []
    for name in GPU_ENGINES:
        (device,) = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        ids.append(tuple(device.get("device_ids", [])))
    assert ids[0] != ids[1], "both engines would share one GPU"


def test_engines_are_launched_with_the_documented_flags() -> None:
    vllm = SERVICES["vllm"]["entrypoint"] + command("vllm")
    assert vllm[:2] == ["vllm", "serve"]
    for flag in ("--enable-prefix-caching", "--enable-auto-tool-choice", "--served-model-name"):
        assert flag in vllm
    assert vllm[vllm.index("--tool-call-parser") + 1] == "hermes"
    assert vllm[vllm.index("--port") + 1] == "8000" and vllm[vllm.index("--host") + 1] == "0.0.0.0"
    sglang = command("sglang")
    assert sglang[:3] == ["python3", "-m", "sglang.launch_server"]
    for flag in ("--model-path", "--enable-metrics", "--served-model-name"):
        assert flag in sglang
    assert sglang[sglang.index("--tool-call-parser") + 1] == "qwen25"
    assert sglang[sglang.index("--port") + 1] == "30000"
    # the simulators take the same feature flags
    for name in SERVICES:
        if "sim" in profiles(name):
            cmd = command(name)
            engine = cmd[cmd.index("--engine") + 1]
            parser = cmd[cmd.index("--tool-call-parser") + 1]
            assert parser == {"vllm": "hermes", "sglang": "qwen25"}[engine]
            assert ("--enable-metrics" in cmd) == (engine == "sglang")


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    assert "/healthz" in " ".join(SERVICES["gateway"]["healthcheck"]["test"])
    for name in GPU_ENGINES:
        assert "/health" in " ".join(SERVICES[name]["healthcheck"]["test"])
        assert SERVICES[name]["healthcheck"]["start_period"].endswith("s")  # weights load slowly


def test_two_gateway_replicas_behind_nginx() -> None:
    gateway, nginx = SERVICES["gateway"], SERVICES["nginx"]
    assert gateway["deploy"]["replicas"] == 2
    assert "ports" not in gateway, "the replicas are reached through nginx only"
    assert "container_name" not in gateway  # would forbid replicas
    assert nginx["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert any(str(p).endswith(":8080") for p in nginx["ports"])
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in nginx["volumes"]
    assert networks("nginx") & networks("gateway")


def test_gateway_config_env_and_shutdown() -> None:
    gateway = SERVICES["gateway"]
    env = gateway["environment"]
    assert env["REDIS_URL"].startswith("redis://redis:")
    assert "GATEWAY_JWT_SECRET" in env and "GATEWAY_SERVER__WORKERS" in env
    assert gateway["command"] == ["serve", "--config", "/etc/gateway/gateway.yaml"]
    (mount,) = gateway["volumes"]
    m = re.fullmatch(r"\./\$\{GATEWAY_CONFIG_FILE:-(.+)\}:/etc/gateway/gateway.yaml:ro", mount)
    assert m, mount
    default = m.group(1)
    sim_env = dict(
        line.split("=", 1)
        for line in (COMPOSE_DIR / "sim.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert sim_env["COMPOSE_PROFILES"] == "sim"
    grace = int(gateway["stop_grace_period"].rstrip("s"))
    for profile, config in (("gpu", default), ("sim", sim_env["GATEWAY_CONFIG_FILE"])):
        settings = load_settings(COMPOSE_DIR / config, environ=SECRET_ENV)
        assert settings.server.graceful_shutdown_s < grace, "compose would SIGKILL draining streams"
        assert settings.redis.url == env["REDIS_URL"]
        hosts = {re.match(r"http://([^:/]+)", b.url).group(1) for p in settings.pools for b in p.backends}  # type: ignore[union-attr]
        assert hosts <= set(active(profile)) | aliases(profile), (profile, hosts)


def aliases(profile: str) -> set[str]:
    out: set[str] = set()
    for service in active(profile).values():
        nets = service.get("networks", {})
        if isinstance(nets, dict):
            for net in nets.values():
                out |= set((net or {}).get("aliases", []))
    return out


def test_engines_and_redis_are_private() -> None:
    nets = DOC["networks"]
    for name in ("engines", "state"):
        assert nets[name].get("internal") is True
    for name, service in SERVICES.items():
        is_engine = name in GPU_ENGINES or name.startswith("sim-")
        if is_engine or name == "redis":
            assert "ports" not in service, f"{name} publishes a port"
        if is_engine:
            # shares a network only with the gateway and Prometheus
            peers = {
                other for other in SERVICES if other != name and networks(other) & networks(name) - {"egress"}
            }
            assert peers - GPU_ENGINES - {n for n in SERVICES if n.startswith("sim-")} <= {
                "gateway",
                "prometheus",
            }, (name, peers)
    assert {n for n in SERVICES if "egress" in networks(n)} <= GPU_ENGINES
    redis_peers = {n for n in SERVICES if n != "redis" and networks(n) & networks("redis")}
    assert redis_peers == {"gateway"}


def test_observability_mounts_reference_deploy_prometheus_and_grafana() -> None:
    prom = SERVICES["prometheus"]
    assert "../prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    grafana = SERVICES["grafana"]
    assert any(v.startswith("../grafana/provisioning:/etc/grafana/provisioning") for v in grafana["volumes"])
    assert networks("prometheus") & networks("gateway") and networks("prometheus") & networks("grafana")


def test_images_are_tagged() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        assert re.search(r":[^/]+$", image), f"{name}: image {image} has no tag"


def test_hardening() -> None:
    for name in ("gateway", "nginx", "redis", *(n for n in SERVICES if n.startswith("sim-"))):
        service = SERVICES[name]
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert service.get("user") or "sim" in profiles(name), name


NGINX = (COMPOSE_DIR / "nginx.conf").read_text()


def _directives(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"#[^\n]*", "", text)
    return [(m.group(1), m.group(2).strip()) for m in re.finditer(r"(\w+)\s+([^;{}]*);", text)]


@pytest.mark.parametrize(
    ("directive", "value"),
    [
        ("proxy_buffering", "off"),
        ("proxy_request_buffering", "off"),
        ("proxy_http_version", "1.1"),
        ("proxy_set_header", 'Connection ""'),
        ("proxy_pass", "http://gateway"),
    ],
)
def test_nginx_streaming_settings(directive: str, value: str) -> None:
    assert (directive, value) in _directives(NGINX)


def test_nginx_upstream_keepalive_and_timeouts() -> None:
    d = dict(_directives(NGINX))
    assert int(d["keepalive"]) > 0
    assert re.search(r"server\s+gateway:8080", NGINX)
    assert int(d["proxy_read_timeout"].rstrip("s")) >= 600
    assert int(d["proxy_send_timeout"].rstrip("s")) >= 600
    assert NGINX.count("{") == NGINX.count("}")


def test_engines_publish_kv_events_and_the_gateway_follows_them() -> None:
    """vLLM and SGLang publish KV-cache events (their own --kv-events-config); the gpu config
    discovers both (vLLM's `/kv_event_sources`, SGLang's `/server_info`; docs/operations.md)."""
    import json

    for name in GPU_ENGINES:
        argv = [*SERVICES[name].get("entrypoint", []), *command(name)]
        config = json.loads(argv[argv.index("--kv-events-config") + 1])
        assert config["publisher"] == "zmq" and config["endpoint"] == "tcp://*:5557", name
        assert config.get("enable_kv_cache_events", name == "sglang") is True
    settings = load_settings(COMPOSE_DIR / "gateway.gpu.yaml", environ=SECRET_ENV)
    pools = {p.name: p for p in settings.pools}
    assert pools["vllm"].kv_event_discovery and pools["sglang"].kv_event_discovery
    assert all(b.kv_events is None for p in settings.pools for b in p.backends)
