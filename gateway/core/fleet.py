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
from policies.types import BackendView, FleetSnapshot, PoolView, same_views


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
    #: attempts there that got a first token or ended (`requests_total` less this: not yet started)
    started: int = 0
    #: `requests_total` and `started` when `load` was scraped: what was sent and started since then
    #: corrects the engine's waiting gauge between scrapes (`policies.flow.engine_backlog`)
    scrape_sent: int = 0
    scrape_started: int = 0
    #: the last view (`view`) and the scrape it was made with: returned again while nothing it shows
    #: changed (a frozen dataclass costs ~2 us to build; every request takes a snapshot)
    _view: BackendView | None = field(default=None, init=False, repr=False)
    _view_load: EngineLoad | None = field(default=None, init=False, repr=False)

    def scraped(self, load: EngineLoad, at: float) -> None:
        """The engine's metrics as scraped at `at`."""
        self.load = load
        self.load_at = at
        self.scrape_sent = self.requests_total
        self.scrape_started = self.started

    def routable(self, now: float) -> bool:
        return self.healthy is not False and not self.draining and not self.circuit.is_open(now)

    def view(self, now: float, stale_s: float) -> BackendView:
        """This backend as routing sees it at `now` (the last view when it would be equal)."""
        load = self._load(now, stale_s)
        healthy = self.healthy is not False
        circuit_open = self.circuit.is_open(now)
        last = self._view
        if (
            last is not None
            and last.in_flight == self.in_flight
            and last.prefill == self.prefill
            and last.circuit_open == circuit_open
            and last.healthy == healthy
            and last.draining == self.draining
            and self._view_load is load
        ):
            return last
        view = self._view = self._built(load, healthy, circuit_open)
        self._view_load = load
        return view

    def view_anew(self, now: float, stale_s: float) -> BackendView:
        """This backend as routing sees it at `now`, built (what `view` returns again while it holds)."""
        return self._built(self._load(now, stale_s), self.healthy is not False, self.circuit.is_open(now))

    def _load(self, now: float, stale_s: float) -> EngineLoad | None:
        """The last scrape, unless older than `stale_s`."""
        return self.load if self.load is not None and now - self.load_at <= stale_s else None

    def _built(self, load: EngineLoad | None, healthy: bool, circuit_open: bool) -> BackendView:
        return BackendView(
            name=self.name,
            healthy=healthy,
            draining=self.draining,
            circuit_open=circuit_open,
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
    #: the last view (`view`) and the models dict its frozenset was made from
    _view: PoolView | None = field(default=None, init=False, repr=False)
    _view_models: dict[str, str] | None = field(default=None, init=False, repr=False)

    def view(self, now: float, stale_s: float) -> PoolView:
        """This pool as routing sees it at `now`: the last view when its backends' views are the same
        objects and its own fields unchanged."""
        backends = tuple([b.view(now, stale_s) for b in self.backends.values()])
        last = self._view
        if (
            last is not None
            and self._view_models is self.models
            and last.weight == self.weight
            and last.tool_calling == self.tool_calling
            and last.structured_output == self.structured_output
            and last.dialect == self.dialect.name
            and same_views(last.backends, backends)
        ):
            return last
        view = self._view = self._built(backends)
        self._view_models = self.models
        return view

    def view_anew(self, now: float, stale_s: float) -> PoolView:
        """This pool as routing sees it at `now`, every view built."""
        return self._built(tuple([b.view_anew(now, stale_s) for b in self.backends.values()]))

    def _built(self, backends: tuple[BackendView, ...]) -> PoolView:
        return PoolView(
            name=self.name,
            dialect=self.dialect.name,
            weight=self.weight,
            models=frozenset(self.models),
            tool_calling=self.tool_calling,
            structured_output=self.structured_output,
            backends=backends,
        )


class Fleet:
    def __init__(self, pools: Iterable[PoolSettings], health: HealthSettings, stale_s: float) -> None:
        self._health = health
        self._stale_s = stale_s
        self.pools: dict[str, Pool] = {}
        self.backends: dict[str, Backend] = {}
        self._snapshot: FleetSnapshot | None = None  # the last one (`snapshot`)
        #: changes whenever a backend or pool is added or removed, or a pool's models change
        self.generation = 0
        #: engines' bearer keys by pool and by backend (`set_keys`), and by backend base URL
        self._pool_keys: dict[str, str] = {}
        self._backend_keys: dict[str, str] = {}
        self._keys_by_url: dict[str, str] = {}
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
        self.generation += 1
        self._key_of(backend)
        return backend

    def remove_backend(self, name: str) -> Backend:
        backend = self.backends.pop(name)
        self.generation += 1
        self._keys_by_url.pop(backend.url, None)
        pool = self.pools.get(backend.pool)
        if pool is not None:
            pool.backends.pop(name, None)
        return backend

    def set_keys(self, pool_keys: dict[str, str], backend_keys: dict[str, str]) -> None:
        """The engines' bearer keys (gateway/upstream/credentials.py): a backend's own, else its
        pool's; backends added later take their pool's."""
        self._pool_keys, self._backend_keys = pool_keys, backend_keys
        self._keys_by_url = {}
        for backend in self.backends.values():
            self._key_of(backend)

    def _key_of(self, backend: Backend) -> None:
        key = self._backend_keys.get(backend.name) or self._pool_keys.get(backend.pool)
        if key is not None:
            self._keys_by_url[backend.url] = key

    def authorization(self, url: str) -> str | None:
        """The `authorization` header for a request to `url` (a backend's URL and a path)."""
        keys = self._keys_by_url
        if not keys:
            return None
        end = url.find("/", url.find("//") + 2)
        return keys.get(url if end < 0 else url[:end])

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
        self.generation += 1
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
            existing.weight = overrides.weights.get(ps.name, overrides.rebalanced.get(ps.name, ps.weight))
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
        """The fleet as routing sees it at `now`. Built on every request, so it is made of the last
        views of whatever did not change (`Backend.view`, `Pool.view`), and is the last snapshot
        itself when nothing did: 8 backends cost 27 us a snapshot when every view was built anew
        (`python -m bench.kv_micro --section 5`)."""
        stale = self._stale_s
        pools = tuple([p.view(now, stale) for p in self.pools.values()])
        last = self._snapshot
        if last is not None and same_views(last.pools, pools):
            return last
        snapshot = self._snapshot = FleetSnapshot(pools=pools)
        return snapshot

    def snapshot_anew(self, now: float) -> FleetSnapshot:
        """`snapshot` with every view built: what the remembered views must equal (tests), and what
        each request cost before they were remembered (`bench.kv_micro --section 5`)."""
        stale = self._stale_s
        return FleetSnapshot(pools=tuple([p.view_anew(now, stale) for p in self.pools.values()]))

    def serves(self, model: str) -> bool:
        return any(model in p.models for p in self.pools.values())

    def any_routable(self, now: float) -> bool:
        return any(b.routable(now) for b in self.backends.values())

    def unavailable(self, model: str, now: float, *, probed: bool = False) -> tuple[str, float] | None:
        """Why no backend can take a request for `model` now, and in how many seconds one may
        (a circuit's re-trial, else the next health probe); None when one can. `probed`: a backend
        counts only once a health probe has found it healthy (readiness)."""
        why: dict[str, int] = {}
        retry = float(self._health.interval_s)
        for pool in self.pools.values():
            if model not in pool.models:
                continue
            for b in pool.backends.values():
                if b.routable(now) and pool.weight > 0 and (b.healthy or not probed):
                    return None
                cause = (
                    "in a pool of weight 0"
                    if pool.weight <= 0
                    else "draining"
                    if b.draining
                    else "unhealthy"
                    if b.healthy is False
                    else "not probed yet"
                    if b.healthy is None and not b.circuit.is_open(now)
                    else "with an open circuit"
                )
                why[cause] = why.get(cause, 0) + 1
                if cause == "with an open circuit":
                    retry = min(retry, b.circuit.reopens_in(now))
        if not why:
            return "no backend serves it", retry
        return ", ".join(f"{n} {cause}" for cause, n in why.items()), retry
