"""Model grants: allow-lists, deny-lists, and their combination (each layer only narrows)."""

from __future__ import annotations

from policies.access import EVERY_MODEL, ModelAccess, combine


def test_allow_list_and_deny_list() -> None:
    grant = ModelAccess.of(["a", "b"], ["b"])
    assert grant.permits("a")
    assert not grant.permits("b")  # deny wins over allow
    assert not grant.permits("c")  # not on the allow-list
    assert ModelAccess.of(None, ["x"]).permits("anything")
    assert not ModelAccess.of(None, ["x"]).permits("x")
    assert ModelAccess.of([]).permits("a") is False  # an empty allow-list allows nothing


def test_every_model_is_unrestricted() -> None:
    assert EVERY_MODEL.unrestricted and EVERY_MODEL.permits("whatever")
    assert not ModelAccess.of(["a"]).unrestricted and not ModelAccess.of(None, ["a"]).unrestricted


def test_combine_is_the_intersection_of_what_each_grant_permits() -> None:
    tier = ModelAccess.of(["a", "b", "c"])
    tenant = ModelAccess.of(None, ["c"])
    key = ModelAccess.of(["b", "c", "d"])
    both = combine([tier, None, tenant, key])
    for model in "abcde":
        expected = tier.permits(model) and tenant.permits(model) and key.permits(model)
        assert both.permits(model) is expected, model
    assert both == ModelAccess(frozenset({"b", "c"}), frozenset({"c"}))
    assert combine([]) is EVERY_MODEL and combine([None, EVERY_MODEL]) is EVERY_MODEL


def test_a_layer_can_never_widen_what_another_allows() -> None:
    narrow = ModelAccess.of(["a"])
    assert not combine([narrow, ModelAccess.of(["a", "b"])]).permits("b")
    assert not combine([ModelAccess.of(None, ["a"]), ModelAccess.of(["a"])]).permits("a")


def test_as_dict_is_sorted_for_audit_entries() -> None:
    assert ModelAccess.of(["b", "a"], ["z", "y"]).as_dict() == {
        "allow_models": ["a", "b"],
        "deny_models": ["y", "z"],
    }
    assert EVERY_MODEL.as_dict() == {"allow_models": None, "deny_models": []}
