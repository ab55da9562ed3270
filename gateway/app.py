"""The gateway as one ASGI application, assembled once from `Settings`.

Hot paths (`/v1/chat/completions`, `/v1/completions`) go straight to the pipeline without any
framework routing; the other client APIs (`/v1/responses…`, `/v1/embeddings`, `/v1/messages…`:
gateway/apis/) are matched next, each to its own pipeline; the small fixed endpoints (`/healthz` and
`/health`, `/readyz`, `/metrics`, `/v1/models`) are plain functions; everything else is answered 404
in OpenAI's shape. `build_pipelines` is the one place where the order of each request path is
written down.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from engines.base import Endpoint
from engines.errors import ApiError, model_not_found
from gateway.admission import Admission
from gateway.admission.intake import FormParseStage, ParseStage, ValidateStage
from gateway.admission.sanitise import BOUNDS
from gateway.apis import ApiRoute, Apis
from gateway.control.admin import build_admin_app
from gateway.control.store import MemoryStore, RedisStore, Store
from gateway.control.verbs import ConfigRefused, FleetControl, ReloadResult
from gateway.core.context import Api, Principal, RequestContext
from gateway.core.fleet import Backend, Fleet
from gateway.core.redis_client import connect_redis, describe
from gateway.core.responses import (
    DISCONNECT,
    BytesResponse,
    Headers,
    Message,
    Receive,
    Response,
    Send,
    error_response,
)
from gateway.edge.request_id import request_id_from
from gateway.flow import FlowStage, build_flow
from gateway.flow.compare import EngineStats, report
from gateway.flow.gate import SHED_REASONS
from gateway.flow.rebalance import Rebalancer
from gateway.observability.access_log import AccessLog
from gateway.observability.metrics import Metrics
from gateway.observability.metrics_export import CONTENT_TYPE, MetricsExporter
from gateway.observability.metrics_sampler import MetricsSampler, RedisProbe
from gateway.pipeline import Pipeline, Stage, run_finalizers
from gateway.routing.factory import build_router
from gateway.routing.kv_events import KvEventSync, build_kv_sync
from gateway.routing.shared_load import SharedLoad
from gateway.routing.stage import RouteStage
from gateway.routing.tokens import build_prompt_tokens, tokenizer_problem
from gateway.routing.warmup import Warmups
from gateway.settings import ConfigError, PoolSettings, Settings, diff_settings, load_settings
from gateway.upstream.credentials import KeyedTransport, read_keys
from gateway.upstream.h1 import H1Transport
from gateway.upstream.health import HealthChecker
from gateway.upstream.proxy import ProxyStage
from gateway.upstream.transport import JSON_HEADERS, Transport
from gateway.version import version

if TYPE_CHECKING:
    from gateway.observability.tracing import Tracing

log = logging.getLogger("gateway")

Scope = dict[str, Any]

_HOT: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
#: `owned_by` of every model `/v1/models` lists: the gateway serves them, whoever trained them
OWNED_BY = "gateway"
#: who the rebalancing loop's changes are by, in the audit log
_REBALANCER = Principal(user="gateway")

#: the settings a reload applies at once (dotted-key prefixes); any other change takes a restart
LIVE_SETTINGS = (
    "pools",
    "models",
    "limits.tiers",
    "limits.tenants",
)


class Gateway:
    """The ASGI application. Create it anywhere; connections are opened at ASGI lifespan start-up."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        #: called once start-up has completed (the demo prints its banner then)
        self._on_ready = on_ready
        self.metrics = Metrics()
        self.metrics.build(version(), platform.python_version())
        self.metrics_export = MetricsExporter(self.metrics.registry, settings.metrics)
        self._sampler: MetricsSampler | None = None
        self.fleet = Fleet(settings.pools, settings.upstream.health, settings.routing.scrape_stale_s)
        self.models = {m.name: m for m in settings.models if self.fleet.serves(m.name)}
        self._transport = transport
        self._owns_transport = transport is None
        self._health: HealthChecker | None = None
        self.kv_events: KvEventSync | None = None
        self.access_log = AccessLog(settings.access_log)
        #: None when tracing is off: then the request path carries no trace at all
        self.tracing: Tracing | None = None
        if settings.tracing.enabled:
            # imported only when on: a gateway without tracing does not pay for its imports
            from gateway.observability.tracing import Tracing

            self.tracing = Tracing(settings.tracing, version())
        self.pipeline: Pipeline | None = None
        #: one pipeline per client API beyond chat/completions (gateway/apis/)
        self.pipelines: dict[Api, Pipeline] = {}
        self.apis = Apis(settings.apis)
        self._created = int(time.time())
        self.redis: Redis | None = None
        self.route: RouteStage | None = None
        self.admission = Admission(
            settings.auth, settings.limits, settings.sanitise, settings.redis, self.metrics
        )
        #: None when auth is off (every request is anonymous; the admin API refuses everyone then)
        self.authenticator = self.admission.authenticator
        self.auth_enabled = self.authenticator is not None
        #: API keys (create / revoke / list) for the admin API
        self.api_keys = self.admission.api_keys
        #: flow control: each request's class, and the queue at saturation (gateway/flow/)
        self.flow: FlowStage = build_flow(
            settings.flow,
            self.fleet,
            settings.routing.scrape_stale_s,
            self.admission.priority_class,
            self.metrics,
        )
        self.metrics.flow_classes(list(settings.flow.classes), SHED_REASONS)
        #: the operator's verbs (admin API): fleet changes, audit, reload; the store is bound at start-up
        self.control = FleetControl(
            self.fleet,
            self,
            MemoryStore(),
            on_lost=self.metrics.shared_state_lost,
            known_keys=self.api_keys.known_ids,
            rebalance=settings.routing.rebalance,
        )
        #: what each request that reached an engine cost, per model, pool and traffic class
        self.engine_stats = EngineStats(ttft_target=self.flow.ttft_target)
        #: the closed loop over the pool weights (`routing.rebalance`), None when off
        self.rebalancer: Rebalancer | None = None
        if settings.routing.rebalance:
            self.rebalancer = Rebalancer(
                self.engine_stats, self.fleet, lambda: self.control.overrides.weights, self._rebalanced
            )
        self._admin_app = build_admin_app(
            self.control,
            self.admission.authorize_admin,
            self.api_keys,
            self.explain,
            list(self.models),
            known_models=lambda: self.models,
            spend=self.admission.spend_report,
            tiers=self._tiers,
            api_docs=settings.server.api_docs,
            engines=self._engine_report,
            flow_classes=lambda: list(self.settings.flow.classes),
            flow_report=self.flow.report,
        )
        for pool in self.fleet.pools.values():
            self.metrics.pool_weight.labels(pool.name).set(pool.weight)

    # -- assembly ---------------------------------------------------------------------------------
    def build_pipeline(self, transport: Transport) -> Pipeline:
        """The chat and completions pipeline (`build_pipelines` builds it with the others)."""
        return self.build_pipelines(transport)["chat"]

    def build_pipelines(self, transport: Transport) -> dict[Api, Pipeline]:
        """Every API's request path. The stages after the intake are the same objects for all, so
        routing state (prefix affinity) is one whichever API a conversation uses."""
        s = self.settings
        router, features = build_router(s.routing)
        tokens = build_prompt_tokens(s.models)
        route = self.route = RouteStage(self.fleet, router, features, self._on_decision, tokens)
        if self._shares_routing():
            route.shared = SharedLoad(self.fleet, router, route.prepare)
        route.warmups = Warmups(functools.partial(post_json, transport), on_outcome=self.metrics.warmup)
        auth = self.admission.authenticate_stages()
        admit = self.admission.admit_stages(route.shared)
        sanitise = self.admission.sanitise_stage(features)
        caps = self.admission.caps_stage(s.models)
        validate = ValidateStage()
        media = self.admission.media_stage(self._engine_hosts)
        route.models, route.permits = self.models, self.admission.permits
        flow = self._wire_flow(route)
        proxy = ProxyStage(
            transport,
            s.upstream,
            route.reroute,
            self._on_upstream_error,
            route.fallback,
            lease_watch=flow.gate,
        )
        permits = self.admission.permits
        parse = ParseStage(self.models, s.server.max_body_bytes, permits)
        apis = self.apis
        chat: list[Stage] = [*auth, parse, validate, media, sanitise, *caps, *admit, flow, route, proxy]
        pipelines: dict[Api, list[Stage]] = {
            "chat": chat,
            "responses": [
                *auth,
                parse,
                apis.responses_intake(),
                validate,
                media,
                sanitise,
                *caps,
                *admit,
                flow,
                route,
                proxy,
            ],
            "messages": [
                *auth,
                parse,
                apis.messages_intake(),
                validate,
                media,
                sanitise,
                *caps,
                *admit,
                flow,
                route,
                proxy,
            ],
            "messages.count_tokens": [
                *auth,
                parse,
                apis.messages_intake(count_only=True),
                validate,
                media,
                sanitise,
                *admit,
                apis.count_tokens(),
            ],
            "embeddings": [
                *auth,
                ParseStage(self.models, s.server.max_body_bytes, permits, task="embed"),
                apis.embeddings_intake(features, BOUNDS.context_slack),
                *admit,
                flow,
                route,
                proxy,
            ],
        }
        any_task = ParseStage(self.models, s.server.max_body_bytes, permits, task=None)
        pipelines["tokenize"] = [*auth, any_task, apis.tokenize_intake(features), media, *admit, route, proxy]
        pipelines["detokenize"] = [*auth, any_task, apis.detokenize_intake(features), *admit, route, proxy]
        scores = ParseStage(self.models, s.server.max_body_bytes, permits, task="score")
        slack = BOUNDS.context_slack
        pipelines["rerank"] = [*auth, scores, apis.rerank_intake(features, slack), *admit, flow, route, proxy]
        pipelines["score"] = [*auth, scores, apis.score_intake(features, slack), *admit, flow, route, proxy]
        # an uploaded audio file is a media item: the media cap is its cap
        media_max = s.sanitise.media.max_bytes
        form = FormParseStage(self.models, apis.audio_body_bytes(media_max), permits, task="transcribe")
        transcribe = apis.audio_intake("transcribe", features, media_max)
        translate = apis.audio_intake("translate", features, media_max)
        pipelines["audio.transcriptions"] = [*auth, form, transcribe, *admit, flow, route, proxy]
        pipelines["audio.translations"] = [*auth, form, translate, *admit, flow, route, proxy]
        for lookup in ("responses.get", "responses.delete", "responses.input_items"):
            pipelines[lookup] = [*auth, apis.lookup(lookup)]
        tracing = self.tracing
        if tracing is not None:  # spans around the stages a trace shows (auth, admit, route)
            return {api: Pipeline(tracing.wrap(stages)) for api, stages in pipelines.items()}
        return {api: Pipeline(stages) for api, stages in pipelines.items()}

    def _wire_flow(self, route: RouteStage) -> FlowStage:
        """The flow stage joined to routing: the route stage's tokens before a request waits, and
        with shared routing state the other processes' queued prefill and flow queues, this one's
        queue in the figures it writes, and the store's refresh while requests wait."""
        flow = self.flow
        flow.gate.prepare = route.prepare
        flow.pools_for = route.flow_pools
        shared = route.shared
        if shared is not None:
            shared.flow_queued = flow.gate.queued
            flow.gate.others = shared.others_flow
            flow.pressure.others_prefill = shared.others_prefill
            flow.gate.refresh = self.admission.report_share
            flow.figures = self.admission.shared_figures
            flow.process = shared.process
        return flow

    def _shares_routing(self) -> bool:
        """Routing processes share in-flight counts and placements through Redis (docs/routing.md,
        *Shared load*): with Redis outside Cluster mode (its keys have a hash tag of their own, which a
        user's limit keys do not share), for the policies that weigh load."""
        s = self.settings
        return (
            s.routing.shared.enabled
            and s.redis.configured
            and s.redis.mode != "cluster"
            and s.routing.policy != "round_robin"
        )

    def _tiers(self) -> tuple[list[str], str]:
        """The configured limits tiers and the default one (a reload changes them)."""
        limits = self.settings.limits
        return list(limits.tiers), limits.default_tier

    def _engine_hosts(self) -> list[str]:
        """The backends' hosts (media must never come from an engine's address)."""
        return [urlsplit(b.url).hostname or "" for b in self.fleet.backends.values()]

    async def _get_json(self, url: str) -> Any:
        """A backend's JSON answer to a GET (KV event discovery), None when not 200."""
        assert self._transport is not None
        status, body = await _exchange(self._transport, "GET", url)
        return orjson.loads(body) if status == 200 else None

    def _on_decision(self, decision: Any) -> None:
        self.metrics.observe_decision(decision)

    def _on_upstream_error(self, backend: Backend, kind: str) -> None:
        self.metrics.upstream_error(backend.pool, kind, backend.name)

    async def _engine_report(self, window_s: int, model: str | None) -> dict[str, Any]:
        """`GET /admin/engines/compare`: the window's comparison and the rebalancing loop."""
        window = await self.engine_stats.window(window_s, model)
        loop = await self.rebalancer.status() if self.rebalancer is not None else {"enabled": False}
        return report(window, loop)

    async def _rebalanced(
        self, model: str, before: dict[str, Any], after: dict[str, Any], weights: dict[str, float]
    ) -> bool:
        """The rebalancing loop's move, written like an admin's change (audited, on every replica)."""
        updates = {f"rebalance:{pool}": weight for pool, weight in weights.items()}
        return await self.control.change_fleet(
            _REBALANCER, "pool_rebalanced", model, before, after, updates=updates
        )

    # -- lifecycle --------------------------------------------------------------------------------
    async def startup(self) -> None:
        up = self.settings.upstream
        if self._transport is None:
            self._transport = H1Transport()
        keys, problems = read_keys(self.settings.pools)
        if problems:
            raise RuntimeError("the engines' keys cannot be read: " + "; ".join(problems))
        self.fleet.set_keys(*keys)
        # every request to an engine carries its key, whoever sends it (proxy, probes, warm-ups)
        self._transport = KeyedTransport(self._transport, self.fleet.authorization)
        store: Store = self.control.store
        if self.settings.redis.configured:
            # standalone, sentinel or cluster (redis.mode); a RedisCluster speaks the same commands
            self.redis = cast(Redis, connect_redis(self.settings.redis))
            store = RedisStore(self.redis)
        await self.admission.start(self.redis)
        self.apis.start(self.redis)
        if self.tracing is not None:
            self.tracing.start()
        self.pipelines = self.build_pipelines(self._transport)
        self.pipeline = self.pipelines["chat"]
        await self.control.start(store)
        assert self.route is not None
        shared = self.route.shared
        self._health = HealthChecker(
            self.fleet,
            self._transport,
            interval_s=up.health.interval_s,
            timeout_s=up.health.timeout_s,
            scrape_interval_s=self.settings.routing.scrape_interval_s,
            elsewhere=shared.elsewhere if shared is not None else None,
        )
        await self._health.start()
        if self.settings.routing.scrape_interval_s > 0:  # while requests wait, the engines are read often
            self.flow.gate.scrape = self._health.scrape_all
        self.kv_events = build_kv_sync(
            self.route.router.kv_index, self.fleet, self.base_pools, self._get_json
        )
        if self.kv_events is not None:
            await self.kv_events.start()
        redis = self.redis
        probe = RedisProbe(redis, self.metrics, up.health.timeout_s) if redis is not None else None
        kv = self.kv_events.subscriber.report if self.kv_events is not None else None
        self._sampler = MetricsSampler(self.fleet, self.metrics, redis=probe, kv=kv)
        await self._sampler.start()
        await self.engine_stats.start(self.redis)
        if self.rebalancer is not None:
            await self.rebalancer.start(self.redis)
        healthy = sum(1 for b in self.fleet.backends.values() if b.healthy)
        log.info(
            "gateway ready: %d pools, %d backends (%d healthy), shared state: %s",
            len(self.fleet.pools),
            len(self.fleet.backends),
            healthy,
            describe(self.settings.redis),
        )
        if self._on_ready is not None:
            self._on_ready()

    async def shutdown(self) -> None:
        await self.flow.aclose()
        if self._sampler is not None:
            await self._sampler.stop()
        if self.rebalancer is not None:
            await self.rebalancer.stop()
        await self.engine_stats.stop()
        await self.control.store.stop()
        await self.admission.aclose()
        if self._health is not None:
            await self._health.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.route is not None and self.route.warmups is not None:
            await self.route.warmups.stop()
        if self.route is not None and self.route.tokens is not None:
            self.route.tokens.close()  # the tokenizer's worker thread
        if self.redis is not None:
            await self.redis.aclose()
        if self._transport is not None and self._owns_transport:
            await self._transport.aclose()
        if self.tracing is not None:
            # what is queued is exported first (each export bounded by its timeout)
            await self.tracing.aclose()

    # -- ASGI -------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            endpoint = _HOT.get(path)
            if endpoint is not None and scope["method"] == "POST":
                await self._proxy(scope, receive, send, endpoint)
            elif (api := self.apis.match(scope["method"], path)) is not None:
                await self._api(scope, receive, send, api)
            elif path.startswith("/admin/") or (
                path in ("/docs", "/openapi.json") and self.settings.server.api_docs
            ):
                await self._admin_app(scope, receive, _with_request_id(send, dict(scope["headers"])))
            else:
                await self._small(scope, receive, send, path)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _api(self, scope: Scope, receive: Receive, send: Send, api: ApiRoute) -> None:
        if api.allowed:
            await self._proxy(scope, receive, send, api.endpoint, api)
            return
        rid = request_id_from(dict(scope["headers"]))
        headers = [(b"x-request-id", rid.encode()), (b"allow", ", ".join(api.methods).encode())]
        err = api.not_allowed(scope["method"], scope["path"])
        await error_response(err, headers, api.render_error)(send, receive)

    async def _proxy(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint, api: ApiRoute | None = None
    ) -> None:
        headers = dict(scope["headers"])
        rid = request_id_from(headers)
        extensions = scope.get("extensions")
        ctx = RequestContext(
            request_id=rid,
            endpoint=endpoint,
            started=time.perf_counter(),
            headers=headers,
            receive=receive,
            on_disconnect=extensions.get(DISCONNECT) if extensions else None,
            api="completions" if endpoint == "completions" else "chat",
        )
        ctx.response_headers.append((b"x-request-id", rid.encode()))
        tracing = self.tracing
        if tracing is not None:
            ctx.trace = tracing.begin(headers)
        pipeline = self.pipeline
        if api is not None:
            api.prepare(ctx, scope.get("query_string", b""))
            pipeline = self.pipelines.get(api.api)
        assert pipeline is not None, "lifespan start-up has not run"
        response = await pipeline.run(ctx)
        ctx.status = response.status
        try:
            await response(send, receive)
        except OSError:
            ctx.error_kind = ctx.error_kind or "client_disconnect"
        finally:
            await run_finalizers(ctx)
            self.flow.finished(ctx)
            now = time.perf_counter()
            self.metrics.observe_request(ctx, now)
            self.engine_stats.record(ctx, now)
            self.access_log.write(ctx, now)
            if tracing is not None:
                tracing.end(ctx, scope["method"], scope["path"])

    async def _small(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method = scope["method"]
        rid = request_id_from(dict(scope["headers"]))
        headers = [(b"x-request-id", rid.encode())]
        response: Response
        if method not in ("GET", "HEAD"):
            if path in _HOT:
                response = error_response(ApiError(405, f"Method {method} not allowed on {path}."), headers)
            else:
                response = error_response(_not_found(method, path), headers)
        elif path == "/healthz" or path == "/health":  # /health: what vLLM/SGLang and their benchmarks probe
            response = BytesResponse(200, b'{"status":"ok"}', headers)
        elif path == "/readyz":
            reasons = await self._not_ready()
            body = orjson.dumps(
                {"status": "not ready", "reasons": reasons} if reasons else {"status": "ready"}
            )
            response = BytesResponse(503 if reasons else 200, body, headers)
        elif path == "/metrics":
            if self.metrics_export.authorized(dict(scope["headers"])):
                self._refresh_gauges()
                body = self.metrics_export.render()
                response = BytesResponse(200, body, headers, content_type=CONTENT_TYPE)
            else:
                denied = ApiError(401, "/metrics needs a bearer token.", code="invalid_api_key")
                response = error_response(denied, headers)
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            response = await self._models(path, dict(scope["headers"]), headers)
        else:
            response = error_response(_not_found(method, path), headers)
        await response(send, receive)

    async def _models(self, path: str, request_headers: dict[bytes, bytes], headers: Headers) -> Response:
        """`/v1/models` and `/v1/models/{id}`: authenticated like chat (a model inventory is
        reconnaissance), answering only what the caller may use."""
        try:
            principal = await self.admission.principal(request_headers)
        except ApiError as err:
            return error_response(err, headers)
        if path == "/v1/models":
            data = [
                self._model_object(n) for n in self.admission.model_access.visible(principal, self.models)
            ]
            return BytesResponse(200, orjson.dumps({"object": "list", "data": data}), headers)
        name = path[len("/v1/models/") :]
        if name in self.models and self.admission.permits(principal, name):
            return BytesResponse(200, orjson.dumps(self._model_object(name)), headers)
        return error_response(model_not_found(name), headers)

    async def _not_ready(self) -> list[str]:
        """Why this replica should get no traffic now (none: ready): not started, a configured model
        that no backend can serve, Redis unreachable where that refuses requests."""
        if self.pipeline is None:
            return ["starting"]
        now = time.monotonic()
        reasons = []
        for name in self.models:
            found = self.fleet.unavailable(name, now, probed=True)
            if found is not None:
                reasons.append(f"model {name}: no routable backend ({found[0]})")
        if not await self._redis_reachable():
            reasons.append("Redis is unreachable and limits.on_redis_error is fail_closed")
        return reasons

    async def _redis_reachable(self) -> bool:
        """Readiness' view of Redis. With `limits.on_redis_error: fail_open` a replica serves through
        a Redis outage (its own limiter takes over), so Redis does not count: taking every replica out
        of the load balancer at once would turn a degraded state into an outage."""
        if self.redis is None or self.settings.limits.on_redis_error == "fail_open":
            return True
        try:
            async with asyncio.timeout(0.5):
                await self.redis.ping()
        except (TimeoutError, RedisError, OSError):
            return False
        return True

    # -- what the control wing is handed (gateway/control/verbs.py `ConfigSource`, the admin API) --
    @property
    def store(self) -> Store:
        """Where the operator's overrides and the audit log live (Redis when configured)."""
        return self.control.store

    def base_pools(self) -> list[PoolSettings]:
        return self.settings.pools

    async def reread_config(self) -> ReloadResult:
        """The config file read again (off the event loop) and validated; what can change live is
        applied (`LIVE_SETTINGS`: pools, models, tiers, tenants, budgets), the rest is reported as
        needing a restart. `ConfigRefused`, with nothing changed, for a file that cannot be used."""
        path = os.environ.get("GATEWAY_CONFIG")
        if not path:
            no_file = "this gateway was started without a config file (gateway demo): nothing to reload"
            raise ConfigRefused([{"file": None, "line": None, "key": "", "message": no_file}])
        try:
            fresh = await asyncio.to_thread(load_settings, path)
        except ConfigError as exc:
            raise ConfigRefused([p.as_dict() for p in exc.problems]) from None
        missing = [p for m in fresh.models if m.tokenizer and (p := tokenizer_problem(m.name, m.tokenizer))]
        if missing:
            raise ConfigRefused(
                [{"file": path, "line": None, "key": "models", "message": p} for p in missing]
            )
        keys, unreadable = await asyncio.to_thread(read_keys, fresh.pools)
        if unreadable:
            raise ConfigRefused(
                [{"file": path, "line": None, "key": "pools", "message": p} for p in unreadable]
            )
        self.fleet.set_keys(*keys)  # a rotated secret is read again here
        changed = diff_settings(self.settings, fresh)
        live = [k for k in changed if k.startswith(LIVE_SETTINGS) and ".tokenizer" not in k]
        restart = [k for k in changed if k not in live]
        limits_live = [k for k in live if k.startswith("limits.")]
        if limits_live and not self.admission.reconfigure(fresh.limits):
            restart += limits_live
            live = [k for k in live if k not in limits_live]
        update: dict[str, Any] = {"pools": fresh.pools, "models": fresh.models}
        if not any(k.startswith("limits.") for k in restart):
            update["limits"] = fresh.limits
        self.settings = self.settings.model_copy(update=update)
        served = {m.name: m for m in fresh.models if any(m.name in p.models for p in fresh.pools)}
        self.models.clear()  # in place: the parse stage holds this mapping
        self.models.update(served)
        log.info(
            "config reloaded from %s: applied %s; needs a restart: %s", path, live or "-", restart or "-"
        )
        return ReloadResult(changed, live, restart)

    def explain(self, body: dict[str, Any], pin: str | None, priority: str | None = None) -> dict[str, Any]:
        """Where `body` would be routed now, and why, with its flow-control class and what the flow
        stage would do with it (the admin API's dry run; `priority` as `x-gateway-priority`)."""
        assert self.route is not None, "lifespan start-up has not run"
        model = body.get("model")
        if not isinstance(model, str) or model not in self.models:
            raise model_not_found(str(model))
        out = self.route.explain(body, pin)
        out["flow"] = self.flow.explain(body, priority)
        return out

    def _model_object(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": OWNED_BY,
        }

    def _refresh_gauges(self) -> None:
        """Sample the fleet gauges now (this worker), so a scrape sees its freshest state."""
        if self._sampler is not None:
            self._sampler.sample()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def post_json(transport: Transport, url: str, body: bytes) -> int:
    """POST `body` (JSON) to `url`: the response's status, its body dropped (warm-ups)."""
    return (await _exchange(transport, "POST", url, body, JSON_HEADERS))[0]


async def _exchange(
    transport: Transport,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request of the gateway's own to a backend (not a client's): its status and whole body."""
    resp = await transport.request(method, url, body, headers if headers is not None else {})
    try:
        data = await resp.read()
    finally:
        resp.close()
    return resp.status, data


def _with_request_id(send: Send, headers: dict[bytes, bytes]) -> Send:
    """`send` that adds `x-request-id` to the response start (for the admin app's answers)."""
    rid = request_id_from(headers).encode()

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid)]
        await send(message)

    return wrapped


def _not_found(method: str, path: str) -> ApiError:
    return ApiError(404, f"Invalid URL ({method} {path})", type="invalid_request_error")
