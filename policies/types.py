"""Shared value types of the routing policies.

Everything here is an immutable value: the gateway builds a `FleetSnapshot` from its own state
(admin weights, health, drain, in-flight counts, scraped engine metrics) and a `RequestFeatures` from
the request (see `policies.features`), frozen slotted dataclasses, and the policies answer with a
`BackendChoice` and a `Decision`, named tuples. A named tuple's generated `__new__` runs as interpreted
Python even where the policies are compiled (~2,200 instructions a call), so the routing path builds
them with `backend_choice` and `decision` (`tuple.__new__` with every field: ~1,300 with the call).
Nothing here does I/O.

Error tree (one, raised by `policies.pools` and `policies.router`)::

    RoutingError            no pool/backend can take this request; `.kind` says why:
      kind="unknown_model"  no pool serves the model              -> 404 model_not_found
      kind="unknown_pool"   an admin pin names no pool for model   -> 404 (or 400)
      kind="unavailable"    pools exist but none is eligible now   -> 503 (overloaded/unavailable)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

if TYPE_CHECKING:
    from policies.kv_blocks import PromptBlocks

ToolChoice = Literal["none", "auto", "required", "named"]
Affinity = Literal["hit", "miss", "spill", "none"]
RoutingErrorKind = Literal["unknown_model", "unknown_pool", "unavailable"]


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What routing needs to know about one request; built by `policies.features.extract_features`.

    `block_hashes[i]` identifies the whole rendered prefix up to the end of block `i` (chained), so two
    requests share `block_hashes[:k]` iff their rendered conversations share the first `k` blocks.
    `anchor_hash` identifies the conversation's opening (tool schemas, system prompt, first user
    message): identical for every turn of one conversation, different between conversations.
    `preamble_blocks` counts the leading blocks that lie wholly inside the preamble (tool schemas and
    system/developer messages), i.e. the part many conversations share. `history_blocks` counts the
    leading blocks that lie wholly before the last message: what an earlier turn of the same
    conversation has already sent (the preamble for a first turn; 0 for completions prompts).
    `anchor_blocks` counts the leading blocks that lie wholly inside the opening (the part
    `anchor_hash` identifies; the whole prompt for completions).
    `prompt` is the request's token ids as the engine will see them (the model's chat template and
    tokenizer), with their block keys, when the gateway tokenizes for KV-event routing; None
    otherwise (the estimated blocks above are used alone).
    `batch_tokens` holds the estimated tokens of every prompt of a `/v1/completions` batch (a list of
    strings or of token-id lists, which the engines run as one request per prompt), in order; empty for
    a single prompt. `prompt_tokens` and the blocks are the first prompt's (a batch is routed by it);
    `total_prompt_tokens` and `longest_prompt_tokens` cover them all.
    `placed_on` is the backend the fleet's shared store names for the request's prefix group (the
    first routing process to place the group set it; `policies.shared_load`), None without one;
    `placed_before` says the store had it before this request (another request placed it), so the
    group's first prefill is under way there rather than this request's to pay.
    """

    model: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    anchor_hash: int
    preamble_blocks: int
    has_tools: bool
    tool_choice: ToolChoice | None
    structured_output: bool
    session_key: str | None = None
    max_tokens: int | None = None
    history_blocks: int = 0
    anchor_blocks: int = 0
    prompt: PromptBlocks | None = field(default=None, compare=False, repr=False)
    placed_on: str | None = None
    placed_before: bool = False
    batch_tokens: tuple[int, ...] = ()
    #: the request asks for reasoning (`reasoning_effort`, or thinking on in `chat_template_kwargs`)
    reasoning: bool = False

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens over every prompt of a batch (what the engines will count)."""
        return sum(self.batch_tokens) if self.batch_tokens else self.prompt_tokens

    @property
    def longest_prompt_tokens(self) -> int:
        """The longest prompt of a batch (each must fit the context on its own)."""
        return max(self.batch_tokens) if self.batch_tokens else self.prompt_tokens

    @property
    def needs_tool_parser(self) -> bool:
        """Tools are offered and may be called, so the engine must run a tool-call parser."""
        return self.has_tools and self.tool_choice != "none"


@dataclass(frozen=True, slots=True)
class BackendView:
    """One engine server as the gateway sees it right now.

    `name` is an opaque id, never an address. Engine-reported values (`queue_depth`, `running`,
    `kv_usage`) are None when unknown or stale; `in_flight` is this gateway replica's own count.
    """

    name: str
    healthy: bool = True
    draining: bool = False
    circuit_open: bool = False
    in_flight: int = 0
    queue_depth: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    max_concurrency: int | None = None
    #: estimated prompt tokens sent there whose first token has not come back yet, less what the
    #: backend was expected to hold of them: the prefill queued ahead of a new request
    prefill: int = 0

    @property
    def routable(self) -> bool:
        """May receive a new request: healthy, not draining, circuit closed."""
        return self.healthy and not self.draining and not self.circuit_open


@dataclass(frozen=True, slots=True)
class PoolView:
    """A set of interchangeable backends of one dialect with a live routing weight."""

    name: str
    dialect: str
    weight: float
    models: frozenset[str]
    tool_calling: bool
    structured_output: bool
    backends: tuple[BackendView, ...]

    @property
    def routable_backends(self) -> tuple[BackendView, ...]:
        return tuple(b for b in self.backends if b.routable)

    def has_routable_backend(self) -> bool:
        # `BackendView.routable` inlined, and a loop rather than `any` over a generator: the pool
        # choice asks this on every request
        for b in self.backends:  # noqa: SIM110
            if b.healthy and not b.draining and not b.circuit_open:
                return True
        return False


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The whole fleet at one instant. Pool names are unique; order is significant only for ties."""

    pools: tuple[PoolView, ...]
    _by_name: dict[str, PoolView] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {p.name: p for p in self.pools})

    def pool(self, name: str) -> PoolView | None:
        """The pool called `name`, or None."""
        return self._by_name.get(name)

    def serves(self, model: str) -> bool:
        """Some pool (eligible or not) lists `model`."""
        return any(model in p.models for p in self.pools)


def same_views(a: Sequence[object], b: Sequence[object]) -> bool:
    """The same view objects in the same order: a view made of views that did not change may be the
    last one again (`gateway.core.fleet`, `policies.shared_load.WithOthers`). `map` runs in C: a
    generator costs ~1 us here."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


class BackendChoice(NamedTuple):
    """A backend policy's answer inside one pool. `reason` is a header-safe token, e.g. `affinity:hit`."""

    backend: str
    reason: str
    affinity: Affinity = "none"
    #: a backend to warm with the request's first `warm_tokens` tokens (a hot group's next holder,
    #: `PrefixAffinityConfig.warm_spread`), or None
    warm: str | None = None
    warm_tokens: int = 0
    #: the estimated prompt tokens this request leaves the backend to prefill (`BackendView.prefill`)
    prefill: int = 0


class Decision(NamedTuple):
    """Where to send a request and why.

    `reason` is a header-safe token made of `+`-joined parts, e.g. `rule:long-prompt+weights+affinity:hit`
    (see docs/routing.md); it never contains an address.
    """

    pool: str
    backend: str
    reason: str
    affinity: Affinity
    warm: str | None = None
    warm_tokens: int = 0
    prefill: int = 0


# `tuple.__new__(Cls, values)`: builds a named tuple in C, without its interpreted `__new__`; it does
# not check the arity, so only the functions below call it, each with every field of its class
new_tuple: Final = tuple.__new__


def backend_choice(
    backend: str,
    reason: str,
    affinity: Affinity = "none",
    warm: str | None = None,
    warm_tokens: int = 0,
    prefill: int = 0,
) -> BackendChoice:
    """`BackendChoice(...)`, built in C (see the module docstring)."""
    return new_tuple(BackendChoice, (backend, reason, affinity, warm, warm_tokens, prefill))


def decision(
    pool: str,
    backend: str,
    reason: str,
    affinity: Affinity,
    warm: str | None = None,
    warm_tokens: int = 0,
    prefill: int = 0,
) -> Decision:
    """`Decision(...)`, built in C (see the module docstring)."""
    return new_tuple(Decision, (pool, backend, reason, affinity, warm, warm_tokens, prefill))


class RoutingError(Exception):
    """No eligible pool or backend; `kind` maps to the HTTP status (see the module docstring)."""

    def __init__(self, kind: RoutingErrorKind, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind: RoutingErrorKind = kind
        self.reason = reason

    @property
    def status(self) -> int:
        return 503 if self.kind == "unavailable" else 404
