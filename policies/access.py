"""Model access: which public model names a caller may use.

A grant is an allow-list (None = every model) minus a deny-list. A caller has up to three grants —
their tier's, their tenant's and their API key's — and may use a model only when every one of them
permits it: each layer can narrow what the others allow, never widen it. `combine` folds the
grants into one, so a request costs one set lookup or two.

Pure values only; the gateway decides where the grants come from (docs/admission.md, "Model access").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelAccess:
    """`allow`: the models permitted (None: every model); `deny`: never these, whatever `allow` says."""

    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()

    @classmethod
    def of(cls, allow: Iterable[str] | None = None, deny: Iterable[str] = ()) -> ModelAccess:
        return cls(None if allow is None else frozenset(allow), frozenset(deny))

    @property
    def unrestricted(self) -> bool:
        return self.allow is None and not self.deny

    def permits(self, model: str) -> bool:
        allow = self.allow
        return (allow is None or model in allow) and model not in self.deny

    def narrowed(self, other: ModelAccess) -> ModelAccess:
        """What both grants permit."""
        if other.unrestricted:
            return self
        if self.unrestricted:
            return other
        if self.allow is None:
            allow = other.allow
        elif other.allow is None:
            allow = self.allow
        else:
            allow = self.allow & other.allow
        return ModelAccess(allow, self.deny | other.deny)

    def as_dict(self) -> dict[str, list[str] | None]:
        return {
            "allow_models": None if self.allow is None else sorted(self.allow),
            "deny_models": sorted(self.deny),
        }


EVERY_MODEL = ModelAccess()


def combine(grants: Iterable[ModelAccess | None]) -> ModelAccess:
    """The one grant that permits exactly what every grant permits (None entries are no grant)."""
    out = EVERY_MODEL
    for grant in grants:
        if grant is not None:
            out = out.narrowed(grant)
    return out
