"""Removed settings: a config that still sets one loads with a warning when the gateway can do
what it asks, and fails with a clear error when it cannot (`gateway.removed_settings`)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from gateway.app import OWNED_BY
from gateway.removed_settings import (
    REMOVED,
    Dissolved,
    Frozen,
    Moved,
    RemovedSettingWarning,
    Rewritten,
    migrate,
)
from gateway.routing.settings import PrefixAffinitySettings
from gateway.settings import ConfigError, load_settings, parse_settings


def _halved(config: dict[str, Any], value: Any) -> str:
    config.setdefault("b", {})["half"] = value / 2
    return f"b.half is {value / 2} now"


TABLE = {
    "a.old": Moved("a.new"),
    "a.fixed": Frozen(60, "always 60 (m.CONSTANT)"),
    "a.implied": Frozen(lambda c: c["a"].get("base", 1) * 5, "five times a.base"),
    "a.twice": Rewritten(_halved),
    "a.options": Dissolved(),
    "a.options.moved": Moved("a.new"),
    "a.options.fixed": Frozen([1, 2], "always [1, 2]"),
}


def test_a_moved_setting_is_read_from_its_new_place_with_a_warning() -> None:
    config = {"a": {"old": 3}, "c": 1}
    with pytest.warns(RemovedSettingWarning, match=r"a\.old is now a\.new") as caught:
        assert migrate(config, "gw.yaml", TABLE) == {"a": {"new": 3}, "c": 1}
    assert caught[0].filename == "gw.yaml"  # reported at the config file
    assert config == {"a": {"old": 3}, "c": 1}  # the caller's mapping is left as it was
    with pytest.raises(ValueError, match="both are set"):
        migrate({"a": {"old": 3, "new": 4}}, removed=TABLE)


def test_a_frozen_setting_at_the_value_used_warns_and_any_other_value_fails() -> None:
    with pytest.warns(RemovedSettingWarning, match=r"a\.fixed is no longer a setting \(always 60"):
        assert migrate({"a": {"fixed": 60.0}}, removed=TABLE) == {"a": {}}
    with pytest.raises(ValueError, match=r"a\.fixed: 30 is no longer possible.*always 60"):
        migrate({"a": {"fixed": 30}}, removed=TABLE)
    # a value implied by other settings is compared with what they imply
    with pytest.warns(RemovedSettingWarning, match="five times"):
        assert migrate({"a": {"base": 2, "implied": 10}}, removed=TABLE) == {"a": {"base": 2}}
    with pytest.raises(ValueError, match="five times"):
        migrate({"a": {"implied": 10}}, removed=TABLE)
    with pytest.raises(ValueError):  # true is not 1
        migrate({"a": {"fixed": True}}, removed={"a.fixed": Frozen(1, "one")})


def test_a_rewritten_setting_says_what_it_became() -> None:
    with pytest.warns(RemovedSettingWarning, match=r"a\.twice is no longer a setting: b\.half is 2\.0 now"):
        assert migrate({"a": {"twice": 4}}, removed=TABLE) == {"a": {}, "b": {"half": 2.0}}


def test_a_dissolved_mapping_goes_once_its_keys_are_handled() -> None:
    with pytest.warns(RemovedSettingWarning) as caught:
        out = migrate({"a": {"options": {"moved": 1, "fixed": [1, 2]}}}, removed=TABLE)
    assert out == {"a": {"new": 1}}
    assert sorted(str(w.message).split(" ")[0] for w in caught) == ["a.options.fixed", "a.options.moved"]
    with pytest.warns(RemovedSettingWarning, match=r"a\.options is no longer a setting"):
        assert migrate({"a": {"options": {}}}, removed=TABLE) == {"a": {}}
    with pytest.raises(ValueError, match=r"a\.options\.typo: not a setting"):
        migrate({"a": {"options": {"typo": 1}}}, removed=TABLE)


def test_a_removed_field_of_list_entries_is_handled_in_each_entry() -> None:
    table = {"items[].fixed": Frozen(60, "always 60"), "items[].sub.old": Moved("a.new")}
    config = {"items": [{"fixed": 60}, {"name": "x"}, {"fixed": 60, "sub": {"old": 1}}]}
    with pytest.warns(RemovedSettingWarning) as caught:
        out = migrate(config, removed=table)
    assert out == {"items": [{}, {"name": "x"}, {"sub": {}}], "a": {"new": 1}}
    said = sorted(str(w.message).split(" ")[0] for w in caught)
    assert said == ["items[0].fixed", "items[2].fixed", "items[2].sub.old"]
    with (
        pytest.raises(ValueError, match=r"^items\[1\]\.fixed: 30 is no longer possible"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", RemovedSettingWarning)
        migrate({"items": [{"fixed": 60}, {"fixed": 30}]}, removed=table)


def test_a_config_without_removed_settings_is_untouched_and_silent() -> None:
    config = {"a": {"new": 1}, "other": [1, {"old": 2}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert migrate(config, removed=TABLE) == config


def _config(**sections: Any) -> dict[str, Any]:
    pool = {
        "name": "p",
        "dialect": "vllm",
        "models": {"m": "m"},
        "backends": [{"name": "b", "url": "http://b"}],
    }
    return {"models": [{"name": "m"}], "pools": [pool], **sections}


def test_an_old_policy_options_mapping_loads_as_the_typed_settings_it_became() -> None:
    old = _config(
        routing={
            "policy_options": {
                "load_factor": 0.5,
                "kv": {"max_blocks": 65536, "silent_s": 10},
                "placement_slack": 2,
                "load": {"kv_weight": 0.0, "queue_high": None},
            }
        }
    )
    with pytest.warns(RemovedSettingWarning) as caught:
        settings = parse_settings(old, environ={}, source="gateway.yaml")
    said = sorted(str(w.message) for w in caught)
    assert said[0].startswith(
        "routing.policy_options.kv.max_blocks is now routing.prefix_affinity.kv_max_blocks"
    )
    assert "always 2.0: policies.prefix_affinity.PLACEMENT_SLACK" in " ".join(said)
    assert len(said) == 6 and all(w.filename == "gateway.yaml" for w in caught)
    assert settings.routing.prefix_affinity == PrefixAffinitySettings(load_factor=0.5, kv_max_blocks=65536)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"placement_slack": 0.0}, r"placement_slack: 0\.0 is no longer possible.*PLACEMENT_SLACK"),
        ({"kv": {"anchor_prompts": 0}}, r"kv\.anchor_prompts: 0 is no longer possible"),
        # prefix affinity's load model has no queue threshold; least load's queue threshold is 8
        ({"load": {"queue_high": 8}}, r"load\.queue_high: 8 is no longer possible"),
        ({"no_such_option": 1}, r"routing\.policy_options\.no_such_option: not a setting"),
    ],
)
def test_a_policy_option_the_gateway_cannot_honour_is_an_error(options: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error), warnings.catch_warnings():
        warnings.simplefilter("ignore", RemovedSettingWarning)
        parse_settings(_config(routing={"policy_options": options}), environ={})
    with warnings.catch_warnings():  # ... while least load's own value is just a warning
        warnings.simplefilter("ignore", RemovedSettingWarning)
        parse_settings(
            _config(routing={"policy": "least_load", "policy_options": {"load": {"queue_high": 8}}}),
            environ={},
        )


def _at(path: str, value: Any) -> dict[str, Any]:
    config = _config()
    if path.startswith("auth."):  # (an auth section needs a key source, or to say it has none)
        config["auth"] = {"enabled": False}
    node = config
    *parents, key = path.split(".")
    for part in parents:
        node = node[part[:-2]][0] if part.endswith("[]") else node.setdefault(part, {})
    node[key] = value
    return config


def _other(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if value is None:
        return 1
    if isinstance(value, (list, tuple)):
        return [*value, "other"]
    if isinstance(value, dict):
        return {"other": ["x"]}
    return f"{value}-other"


FROZEN = sorted(p for p, r in REMOVED.items() if isinstance(r, Frozen))


@pytest.mark.parametrize("path", FROZEN)
def test_every_frozen_setting_loads_at_the_value_used_and_fails_at_another(path: str) -> None:
    removal = REMOVED[path]
    assert isinstance(removal, Frozen)
    used = removal.used(_at(path, None))
    said = re.escape(path.replace("[]", "[0]"))  # a list entry's key is named by its index
    with pytest.warns(RemovedSettingWarning, match=rf"^{said} is no longer a setting"):
        parse_settings(_at(path, used), environ={})
    with pytest.raises(ValueError, match=rf"^{said}: .* is no longer possible"):
        parse_settings(_at(path, _other(used)), environ={})


@pytest.mark.parametrize("path", sorted(p for p, r in REMOVED.items() if isinstance(r, Moved)))
def test_every_moved_setting_is_read_from_its_new_place(path: str) -> None:
    removal = REMOVED[path]
    assert isinstance(removal, Moved)
    values = {
        "routing.policy": "least_load",
        "routing.prefix_affinity.load_factor": 0.75,
        "routing.prefix_affinity.kv_max_blocks": 1000,
    }
    value = values[removal.to]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = parse_settings(_at(path, value), environ={})
    assert str(caught[0].message).startswith(f"{path} is now {removal.to}")
    assert moved == parse_settings(_at(removal.to, value), environ={})


def test_the_default_tier_is_the_tier_named_default() -> None:
    tiers = {"free": {"requests_per_minute": 5}, "pro": {"requests_per_minute": 50}}
    with pytest.warns(RemovedSettingWarning, match="tier 'free' is read as 'default'"):
        settings = parse_settings(_config(limits={"default_tier": "free", "tiers": tiers}), environ={})
    assert settings.limits.tiers.keys() == {"default", "pro"}
    assert settings.limits.tiers["default"].requests_per_minute == 5
    with pytest.warns(RemovedSettingWarning, match="remove it"):
        parse_settings(_config(limits={"default_tier": "default"}), environ={})
    with pytest.raises(ValueError, match="name tier 'free' 'default'"):  # two tiers cannot be one
        parse_settings(
            _config(limits={"default_tier": "free", "tiers": {**tiers, "default": {}}}), environ={}
        )


def test_a_models_own_special_tokens_join_the_one_list() -> None:
    by_model = {"m": ["<my_turn>", "<|im_start|>"]}
    with pytest.warns(RemovedSettingWarning, match=r"1 token\(s\) of the models' own lists are added"):
        settings = parse_settings(
            _config(sanitise={"special_tokens_by_model": by_model, "special_token_list": ["<|im_start|>"]}),
            environ={},
        )
    assert settings.sanitise.special_token_list == ["<|im_start|>", "<my_turn>"]


def test_the_models_owner_is_the_constant_it_became() -> None:
    removal = REMOVED["models[].owned_by"]
    assert isinstance(removal, Frozen) and removal.value == OWNED_BY


def test_the_public_keys_algorithms_are_one_list() -> None:
    pem = "-----BEGIN PUBLIC KEY-----"  # (not read: the settings only)
    old = _config(
        auth={
            "jwt": {
                "jwks_url": "https://idp.example/jwks",
                "jwks_algorithms": ["RS256", "ES256"],
                "public_keys": [{"pem": pem, "algorithms": ["RS512"]}, {"pem": pem}],
            }
        }
    )
    with pytest.warns(RemovedSettingWarning) as caught:
        settings = parse_settings(old, environ={})
    assert settings.auth.jwt.algorithms == ["RS256", "ES256", "RS512"]
    said = sorted(str(w.message) for w in caught)
    assert said[0].startswith("auth.jwt.jwks_algorithms is no longer a setting: now auth.jwt.algorithms")
    assert said[1].startswith("auth.jwt.public_keys[0].algorithms is no longer a setting")
    # a static key's algorithms alone join the default list, which keys without their own use
    with pytest.warns(RemovedSettingWarning, match="public_keys"):
        settings = parse_settings(
            _config(auth={"jwt": {"public_keys": [{"pem": pem, "algorithms": ["ES384"]}]}}), environ={}
        )
    assert settings.auth.jwt.algorithms == ["RS256", "PS256", "ES256", "EdDSA", "ES384"]
    with pytest.raises(ValueError, match="not a list of algorithms"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RemovedSettingWarning)
        parse_settings(
            _config(auth={"jwt": {"jwks_url": "https://x", "jwks_algorithms": "RS256"}}), environ={}
        )


def test_a_config_file_says_where_a_removed_setting_is(tmp_path: Path) -> None:
    base = "models: [{name: m}]\npools: [{name: p, dialect: vllm, models: {m: m}}]\n"
    path = tmp_path / "gateway.yaml"
    path.write_text(base + "upstream:\n  client: aiohttp\n")
    with pytest.warns(RemovedSettingWarning) as caught:
        load_settings(path, environ={})
    assert (caught[0].filename, caught[0].lineno) == (str(path), 4)
    path.write_text(base + "routing:\n  policy_options:\n    placement_slack: 0.0\n")
    with pytest.raises(ConfigError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", RemovedSettingWarning)
        load_settings(path, environ={})
    (problem,) = info.value.problems
    assert (problem.line, problem.key) == (5, "routing.policy_options.placement_slack")
    assert "no longer possible" in problem.message
    path.write_text("models:\n  - name: m\n  - name: n\n    owned_by: gateway\n" + base.split("\n", 1)[1])
    with pytest.warns(RemovedSettingWarning, match=r"^models\[1\]\.owned_by") as caught:
        load_settings(path, environ={})
    assert caught[0].lineno == 4
