"""The simulators against the real engines, shape by shape.

Every request in `cases.CASES` goes straight to a simulator and to the real server of the same
dialect (not through the gateway), and their answers' structural signatures (`shapes.py`: status,
content type, JSON keys and types, SSE framing and which chunk carries the role, the finish_reason and
the usage) must be equal — except for the differences listed below, each kept on purpose with its
reason (docs/simulators.md, "Verified against", has the same list), and the per-case differences that
random weights decide (`Case.random`, reasons in `Case.why_random`).

Random weights make these impossible to compare, so no case looks at them: generated text, token
counts (the simulator's tokenizer and chat template are not the tiny model's), ids, timestamps, and
whatever depends on what the model writes — whether a tool call or a JSON object is complete, and so
the finish_reason of tool and JSON cases. Everything else is compared.

The simulators run with the real servers' flags (served name, context length, tool parser, cache
reports), so a difference is the simulator's, not a configuration's.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import httpx
import pytest

from engines.sim.launcher import SimProcess, free_port
from tests.real_engines.cases import CASES, CONTEXT, SERVED, Case
from tests.real_engines.rig import ENGINE_HEADERS
from tests.real_engines.servers import EngineServer
from tests.real_engines.shapes import differences, shape_of

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

VALIDATION_WORDING = (
    "pydantic's validation messages: the simulator writes one line per field in pydantic's style; "
    "the engines' own wording carries pydantic's version (`int_parsing` vs `int_type`, the echoed "
    "input) and SGLang appends a traceback with its server's file paths, which a simulator should not "
    "invent (the gateway strips both)"
)
# On purpose, per engine: (regex over a line of `differences()`, why it stays)
ON_PURPOSE: dict[str, list[tuple[str, str]]] = {
    "vllm": [
        (r'^body [+-]\.error\.message = "N validation error', VALIDATION_WORDING),
        (
            r"^body [+-]\.error\.(param = \"body\.N\"|param = null|param: (string|null))$",
            'malformed JSON: vLLM reports pydantic\'s position as `param: "body.<offset>"`; the '
            "simulator's JSON reader gives no offset, so its `param` is null",
        ),
    ],
    "sglang": [
        (r'^body [+-]\.message = "N validation error', VALIDATION_WORDING),
    ],
}

# What random weights decide in every streamed case, per engine: (regex, why).
HELD_BACK = (
    "vLLM streams a token's text as it decodes; a random model often picks byte-level tokens that "
    "are part of a multi-byte character, whose text vLLM holds back: such a step is a chunk without "
    "content (`empty`), and when it is the last one the finish_reason comes without text (`finish`). "
    "The simulator's tokens are whole words, so its last text always rides with the finish_reason"
)
HELD_BACK_SGLANG = (
    "SGLang's incremental detokenizer holds back the text of a byte-level token that is part of a "
    "multi-byte character too (seen once in many runs: `role empty content finish`); the random model "
    "picks such tokens by chance"
)
RANDOM_IN_STREAMS: dict[str, list[tuple[str, str]]] = {
    "vllm": [
        (
            r"^sequence\[(\d+|all)\] sim=role content content\+finish real=role( (content|empty))* (content\+)?finish$",
            HELD_BACK,
        ),
        (
            r"^sequence\[(\d+|all)\] sim=text text\+finish real=text( (text|empty))* (text\+)?finish$",
            HELD_BACK,
        ),
    ],
    "sglang": [
        (  # SGLang sends the finish_reason in a chunk of its own, after the content
            r"^sequence\[(\d+|all)\] sim=role content finish real=role( (content|empty))+ finish$",
            HELD_BACK_SGLANG,
        ),
        (
            r"^sequence\[(\d+|all)\] sim=text finish real=text( (text|empty))+ finish$",
            HELD_BACK_SGLANG,
        ),
    ],
}

SIM_FLAGS = {
    # what tests/real_engines/servers.py gives the real servers
    "vllm": [
        "--served-model-name", SERVED, "--max-model-len", str(CONTEXT), "--block-size", "32",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-prompt-tokens-details",
        "--engine-version", "0.32.0",
    ],
    "sglang": [
        "--served-model-name", SERVED, "--context-length", str(CONTEXT), "--enable-metrics",
        "--tool-call-parser", "qwen", "--enable-cache-report", "--engine-version", "0.5.23",
    ],
}  # fmt: skip
_used: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    with contextlib.ExitStack() as stack:
        yield {
            engine: stack.enter_context(
                SimProcess(engine, free_port(), [*flags, "--model", SERVED, "--fast"])
            )
            for engine, flags in SIM_FLAGS.items()
        }


def send(base_url: str, case: Case) -> httpx.Response:
    with httpx.Client(base_url=base_url, headers=ENGINE_HEADERS, timeout=120, trust_env=False) as client:
        if case.method == "GET":
            return client.get(case.path)
        if case.raw is not None:
            return client.post(case.path, content=case.raw, headers={"content-type": "application/json"})
        return client.post(case.path, json=case.body)


def unexplained(engine: str, case: Case, lines: list[str]) -> list[str]:
    left = []
    for line in lines:
        reasons = [p for p, _ in ON_PURPOSE[engine] if re.search(p, line)]
        _used.update((engine, p) for p in reasons)
        random = [*case.random_for(engine), *(p for p, _ in RANDOM_IN_STREAMS[engine])]
        if not reasons and not any(re.search(p, line) for p in random):
            left.append(line)
    return left


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_shape_as_the_real_engine(
    case: Case, real_engine: EngineServer, sims: dict[str, SimProcess]
) -> None:
    engine = real_engine.engine
    real = shape_of(send(real_engine.base_url, case))
    sim = shape_of(send(sims[engine].base_url, case))
    left = unexplained(engine, case, differences(sim, real))
    assert not left, (
        f"{engine} simulator differs from the real server on {case.name}:\n  "
        + "\n  ".join(left)
        + f"\n--- simulator\n{sim.describe()}\n--- real\n{real.describe()}"
    )


@pytest.mark.xdist_group("real_engines")  # the cases' worker: `_used` is that process's
def test_every_on_purpose_difference_still_occurs() -> None:
    """Runs after the cases: an allow-list entry no case needed any more is stale and must go."""
    stale = [(e, p) for e, entries in ON_PURPOSE.items() for p, _ in entries if (e, p) not in _used]
    assert not stale, f"on-purpose differences that no longer occur: {stale}"
