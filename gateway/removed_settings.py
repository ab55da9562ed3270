"""Settings that are gone, and what a config that still sets one gets.

A config file written for an earlier version keeps loading when the gateway can still do what it
asks, and says so: a removed setting is looked up in `REMOVED` (by its dotted path) before the
settings are validated, and

- `Moved`: its value is read from its new place, with a warning naming it;
- `Frozen` (now a constant, or implied by other settings): set to the value the gateway uses, it is
  dropped with a warning; set to anything else it is an error, since the gateway cannot do that;
- `Rewritten`: its meaning lives in another setting now; the entry's function rewrites the config
  (or raises when it cannot) and says what it did;
- `Dissolved`: a mapping every key of which has an entry of its own (`routing.policy_options`):
  dropped once they are handled; any other key in it is an error.

Warnings are `RemovedSettingWarning`s, reported at the config file (the suite turns them into
errors: every config in the tree uses today's keys). A key that is neither a setting nor in
`REMOVED` stays an error, as every unknown key is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]


class RemovedSettingWarning(UserWarning):
    """A config sets a removed setting; the gateway does what it asked (the message says how)."""


class RemovedSettingError(ValueError):
    """A config sets a removed setting to something the gateway cannot do: `key` (dotted) and
    `reason` (what to change)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Moved:
    """Now at the dotted path `to`, with the same meaning and values."""

    to: str


@dataclass(frozen=True)
class Frozen:
    """No longer a setting: the gateway always uses `value` (a function of the whole config when it
    is implied by other settings), which `what` explains ("always 60 s (module.NAME)")."""

    value: object
    what: str

    def used(self, config: Mapping[str, Any]) -> object:
        return self.value(config) if callable(self.value) else self.value


@dataclass(frozen=True)
class Rewritten:
    """`rewrite(config, value)` moves the setting's meaning into today's settings (or raises
    `ValueError`, saying what to change, when it cannot) and returns what it did, for the warning."""

    rewrite: Callable[[Config, Any], str]


@dataclass(frozen=True)
class Dissolved:
    """A mapping whose keys are each removed (each has an entry of its own)."""


Removal = Moved | Frozen | Rewritten | Dissolved

#: every removed setting by its dotted path
REMOVED: dict[str, Removal] = {}


def migrate(
    config: Config,
    source: str = "<config>",
    removed: Mapping[str, Removal] = REMOVED,
    *,
    line: Callable[[str], int | None] | None = None,
) -> Config:
    """`config` (a parsed config file, not changed) with every setting of `removed` handled as the
    module docstring says; warnings are reported at `source`, at `line(key)` when known. Raises
    `RemovedSettingError` for a removed setting whose value the gateway cannot honour."""
    out = _copy(config)
    handled: list[str] = []
    for path in sorted(removed, key=lambda p: -p.count(".")):  # a mapping's keys before the mapping
        parent, _, key = path.rpartition(".")
        node = _node(out, parent)
        if node is None or key not in node:
            continue
        value = node.pop(key)
        removal = removed[path]
        if isinstance(removal, Dissolved):
            if not isinstance(value, dict):
                raise RemovedSettingError(path, "no longer a setting (docs/configuration.md); remove it")
            if value:  # its removed keys are gone already: what is left was never a setting
                raise RemovedSettingError(
                    f"{path}.{sorted(value)[0]}", "not a setting (docs/configuration.md)"
                )
            if any(h.startswith(path + ".") for h in handled):
                continue  # its keys said what became of them
            message = f"{path} is no longer a setting; remove it"
        else:
            message = _apply(out, path, value, removal)
        handled.append(path)
        at = (line(path) if line is not None else None) or 0
        warnings.warn_explicit(message, RemovedSettingWarning, source, at, module="gateway.settings")
    return out


def _apply(config: Config, path: str, value: Any, removal: Moved | Frozen | Rewritten) -> str:
    """Handles the removed setting at `path` (taken out of `config`): the warning to give."""
    match removal:
        case Moved(to):
            parent, _, name = to.rpartition(".")
            target = _node(config, parent, create=True)
            if target is None:
                raise RemovedSettingError(path, f"now {to}, and {parent} is not a mapping")
            if name in target:
                raise RemovedSettingError(path, f"now {to}, and both are set: keep {to} only")
            target[name] = value
            return f"{path} is now {to} (move it there)"
        case Frozen():
            used = removal.used(config)
            if not _same(value, used):
                raise RemovedSettingError(
                    path,
                    f"{value!r} is no longer possible, it is not a setting any more ({removal.what}); remove it",
                )
            return f"{path} is no longer a setting ({removal.what}); remove it"
        case Rewritten(rewrite):
            try:
                return f"{path} is no longer a setting: {rewrite(config, value)}"
            except ValueError as exc:
                raise RemovedSettingError(path, str(exc)) from None


def _same(given: Any, used: object) -> bool:
    if isinstance(given, bool) or isinstance(used, bool):
        return given is used
    if isinstance(given, (list, tuple)) and isinstance(used, (list, tuple)):
        return list(given) == list(used)
    return bool(given == used)


def _node(config: Config, path: str, create: bool = False) -> Config | None:
    node: Any = config
    for part in path.split(".") if path else ():
        if not isinstance(node, dict):
            return None
        if part not in node and create:
            node[part] = {}
        node = node.get(part)
    return node if isinstance(node, dict) else None


def _copy(config: Config) -> Config:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in config.items()}
