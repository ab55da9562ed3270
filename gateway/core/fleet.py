"""The live state of the pools and backends this replica routes to.

`Fleet` owns the mutable per-backend runtime (in-flight count, health, circuit, drain, scraped load)
and the live pool weights; `snapshot(now)` freezes it into the pure `policies.types.FleetSnapshot`
the routing policies decide on. Admin changes (weights, drain, add/remove) arrive through the methods
here, whether they came from this replica's admin API or from another replica via shared state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engines.base import Dialect, EngineLoad
from engines.registry import get_dialect
from gateway.core.circuit import CircuitBreaker
from gateway.core.overrides import Overrides
from gateway.core.settings import BackendSettings, HealthSettings, PoolSettings
from policies.types import BackendView, FleetSnapshot, PoolView


@dataclass(slots=True, eq=False)
class Backend:
    name: str
    url: str
    pool: str
    circuit: CircuitBreaker
    in_flight: int = 0
    #: estimated prompt tokens of this process's requests there still waiting for their first token,
    #: less what the routing expected the engine to hold of them (`policies.types.BackendView.prefill`)
    prefill: int = 0
    #: result of the last active probe; None until the first probe answered
    healthy: bool | None = None
    draining: bool = False
    load: EngineLoad | None = None
    load_at: float = 0.0
    requests_total: int = 0

    def routable(self, now: float) -> bool:
        return self.healthy is not False and not self.draining and not self.circuit.is_open(now)

    def view(self, now: float, stale_s: float) -> BackendView:
        load = self.load if self.load is not None and now - self.load_at <= stale_s else None
        return BackendView(
            name=self.name,
            healthy=self.healthy is not False,
            draining=self.draining,
            circuit_open=self.circuit.is_open(now),
            in_flight=self.in_flight,
            queue_depth=load.waiting if load else None,
            running=load.running if load else None,
            kv_usage=load.kv_usage if load else None,
            max_concurrency=None,
            prefill=self.prefill,
        )


@dataclass(slots=True, eq=False)
class Pool:
    name: str
    dialect: Dialect
    weight: float
    models: dict[str, str]  # public -> served name
    tool_calling: bool
    structured_output: bool
    backends: dict[str, Backend] = field(default_factory=dict)


class Fleet:
    def __init__(self, pools: Iterable[PoolSettings], health: HealthSettings, stale_s: float) -> None:
        self._health = health
        self._stale_s = stale_s
        self.pools: dict[str, Pool] = {}
        self.backends: dict[str, Backend] = {}
        for ps in pools:
            pool = Pool(
                name=ps.name,
                dialect=get_dialect(ps.dialect),
                weight=ps.weight,
                models=dict(ps.models),
                tool_calling=ps.tool_calling,
                structured_output=ps.structured_output,
            )
            self.pools[pool.name] = pool
            for bs in ps.backends:
                self.add_backend(pool.name, bs)

    # -- changes (admin API, shared state) --------------------------------------------------------
    def add_backend(self, pool_name: str, bs: BackendSettings) -> Backend:
        if bs.name in self.backends:
            raise ValueError(f"backend {bs.name!r} exists")
        pool = self.pools[pool_name]
        backend = Backend(
            name=bs.name,
            url=bs.url,
            pool=pool_name,
            circuit=CircuitBreaker(self._health.failure_threshold, self._health.open_s),
        )
        pool.backends[bs.name] = backend
        self.backends[bs.name] = backend
        return backend

    def remove_backend(self, name: str) -> Backend:
        backend = self.backends.pop(name)
        pool = self.pools.get(backend.pool)
        if pool is not None:
            pool.backends.pop(name, None)
        return backend

    def set_weight(self, pool_name: str, weight: float) -> None:
        self.pools[pool_name].weight = weight

    def set_draining(self, name: str, draining: bool) -> None:
        self.backends[name].draining = draining

    def apply(self, base: Iterable[PoolSettings], overrides: Overrides) -> None:
        """Make the fleet the config's pools and backends with the operator's overrides on top.

        Pools come from the config only; backends are the config's minus the removed plus the added;
        weights and drain state are overridden where set. Backends that leave keep serving the
        requests already sent to them (those hold their own reference).
        """
        base = list(base)
        desired: dict[str, tuple[str, str]] = {}
        for ps in base:
            for bs in ps.backends:
                desired[bs.name] = (ps.name, bs.url)
        pool_names = {ps.name for ps in base}
        for name, (pool_name, url) in overrides.added.items():
            if pool_name in pool_names:
                desired[name] = (pool_name, url)
        for name in overrides.removed:
            desired.pop(name, None)
        for name in [n for n in self.pools if n not in pool_names]:
            for gone in self.pools.pop(name).backends:
                self.backends.pop(gone, None)
        for ps in base:
            existing = self.pools.get(ps.name)
            if existing is not None and existing.dialect.name != ps.dialect:
                for gone in existing.backends:
                    self.backends.pop(gone, None)
                existing = None
            if existing is None:
                existing = Pool(ps.name, get_dialect(ps.dialect), ps.weight, {}, True, True)
                self.pools[ps.name] = existing
            existing.models = dict(ps.models)
            existing.tool_calling = ps.tool_calling
            existing.structured_output = ps.structured_output
            existing.weight = overrides.weights.get(ps.name, ps.weight)
        for name, backend in list(self.backends.items()):
            if desired.get(name) != (backend.pool, backend.url):
                self.remove_backend(name)
        for name, (pool_name, url) in desired.items():
            if name not in self.backends:
                self.add_backend(pool_name, BackendSettings(name=name, url=url))
        for name, backend in self.backends.items():
            backend.draining = name in overrides.drained

    # -- reads ------------------------------------------------------------------------------------
    def snapshot(self, now: float) -> FleetSnapshot:
        stale = self._stale_s
        return FleetSnapshot(
            pools=tuple(
                PoolView(
                    name=p.name,
                    dialect=p.dialect.name,
                    weight=p.weight,
                    models=frozenset(p.models),
                    tool_calling=p.tool_calling,
                    structured_output=p.structured_output,
                    backends=tuple(b.view(now, stale) for b in p.backends.values()),
                )
                for p in self.pools.values()
            )
        )

    def serves(self, model: str) -> bool:
        return any(model in p.models for p in self.pools.values())

    def any_routable(self, now: float) -> bool:
        return any(b.routable(now) for b in self.backends.values())
