"""Removed settings: a config that still sets one loads with a warning when the gateway can do
what it asks, and fails with a clear error when it cannot (`gateway.removed_settings`)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from gateway.removed_settings import (
    Dissolved,
    Frozen,
    Moved,
    RemovedSettingWarning,
    Rewritten,
    migrate,
)


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


def test_a_config_without_removed_settings_is_untouched_and_silent() -> None:
    config = {"a": {"new": 1}, "other": [1, {"old": 2}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert migrate(config, removed=TABLE) == config
