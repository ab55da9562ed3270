"""The requests the simulator-vs-real shape test sends to both, one `Case` per row of ENGINES.md that
a tiny model with random weights can exercise.

Every generating case sets `ignore_eos` and a small `max_tokens`, so both sides produce exactly that
many tokens (`finish_reason: "length"`) whatever the weights; a case that depends on what the model
writes (tool calls, JSON) says so in `random` and is compared only where the weights cannot matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SERVED = "tiny-qwen3"
CONTEXT = 4096  # both real servers and both simulators in the test run with this context length

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
HELLO: list[dict[str, Any]] = [{"role": "user", "content": "Hello there, no tools needed."}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, Any] | None = None  # JSON body (None: a GET, or `raw` is sent)
    path: str = "/v1/chat/completions"
    method: str = "POST"
    raw: bytes | None = None  # a body sent as is (malformed JSON)
    # Lines of `differences()` (regexes) that random weights produce in this case, per engine ("*":
    # both): what the real model writes decides them, not the simulator's shapes. Ignored only here,
    # for the reason in `why_random`.
    random: dict[str, tuple[str, ...]] = field(default_factory=dict)
    why_random: str = ""

    def random_for(self, engine: str) -> tuple[str, ...]:
        return self.random.get("*", ()) + self.random.get(engine, ())


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": HELLO, "max_tokens": 4, "ignore_eos": True, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True, **extra}


USAGE = {"include_usage": True}

# Difference lines (regexes over `shapes.differences()`) that what the model writes decides:
FINISH = (
    r"^(body|[\w+-]+) [+-]\.choices\[\]\.finish_reason = ",  # stop / length / tool_calls
    r"^(body|[\w+-]+) [+-]\.choices\[\]\.matched_stop: ",  # SGLang: the EOS id on a natural stop
)
CALL = (  # a tool call or not, and so `content` text or null
    r"^(body|[\w+-]+) [+-]\.choices\[\]\.(message|delta)\.tool_calls",
    r"^(body|[\w+-]+) [+-]\.choices\[\]\.(message|delta)\.content: ",
)
SEQUENCE = (r"^sequence\[", r"^[\w+-]+ [+-]")  # which chunk kinds come depends on the calls
NAMED_WHY = (
    "named tool_choice: vLLM constrains the output to the tool's parameters, so a call always comes "
    "back (with the forced name), but the random model keeps writing the string value until "
    "max_tokens (finish 'length') where the simulator closes the object ('stop'); SGLang 0.5.23 "
    "constrains to a JSON array of calls and parses it: cut short it gives no call (content '') or "
    '`arguments: "{}"`, run to run'
)
REQUIRED_WHY = (
    "required tool_choice: both engines constrain the output to a JSON array of calls; the random "
    "model does not finish it within max_tokens, so no call is parsed (content '' and no tool_calls), "
    "where the simulator calls the tool"
)
LONG_PROMPT = " ".join(["word"] * (CONTEXT + 200))
NEAR_FULL = " ".join(["word"] * (CONTEXT - 96))  # ~4012 tokens once rendered, on both tokenizers

CASES: list[Case] = [
    # -- chat, whole and streamed -------------------------------------------------------------
    Case("chat", chat()),
    Case("chat-n2", chat(n=2)),
    Case("chat-logprobs", chat(logprobs=True, top_logprobs=2)),
    Case("chat-stream", chat(stream=True)),
    Case("chat-stream-usage", chat(stream=True, stream_options=USAGE)),
    Case("chat-stream-options-empty", chat(stream=True, stream_options={})),
    Case("chat-stream-usage-false", chat(stream=True, stream_options={"include_usage": False})),
    Case(
        "chat-stream-continuous-usage",
        chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    ),
    Case("chat-stream-continuous-only", chat(stream=True, stream_options={"continuous_usage_stats": True})),
    Case("chat-stream-n2", chat(stream=True, n=2, stream_options=USAGE)),
    Case("chat-stream-logprobs", chat(stream=True, logprobs=True, top_logprobs=2)),
    Case("chat-unknown-fields", chat(top_k=5, min_p=0.1, repetition_penalty=1.1, some_unknown_field=1)),
    Case("chat-null-n", chat(n=None)),
    Case("chat-null-stream", chat(stream=None)),
    Case(
        "chat-json-object",
        chat(response_format={"type": "json_object"}, max_tokens=8),
        random={"*": FINISH},
        why_random="the grammar lets the random model close the object early ('stop') or not ('length')",
    ),
    # -- completions ----------------------------------------------------------------------------
    Case("completion", completion(), path="/v1/completions"),
    Case("completion-logprobs", completion(logprobs=2), path="/v1/completions"),
    Case("completion-echo", completion(echo=True), path="/v1/completions"),
    Case("completion-stream", completion(stream=True), path="/v1/completions"),
    Case("completion-stream-usage", completion(stream=True, stream_options=USAGE), path="/v1/completions"),
    # -- errors ---------------------------------------------------------------------------------
    Case("unknown-model", chat(model="no-such-model")),
    Case("stream-options-without-stream", chat(stream_options=USAGE)),
    Case("context-too-long", chat(messages=[{"role": "user", "content": LONG_PROMPT}])),
    # prompt + max_tokens past the context: SGLang refuses it, vLLM 0.32 cuts max_tokens to what fits
    # (a near-full prompt keeps that short)
    Case("context-plus-max-tokens", chat(messages=[{"role": "user", "content": NEAR_FULL}], max_tokens=300)),
    Case("completion-context-too-long", completion(prompt=LONG_PROMPT), path="/v1/completions"),
    Case("tool-choice-without-tools", chat(tool_choice="required")),
    Case("named-tool-without-tools", chat(tool_choice=NAMED)),
    Case(
        "named-tool-not-in-tools",
        chat(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
    ),
    Case("wrong-type", chat(max_tokens="four")),
    Case("missing-messages", {"model": SERVED}),
    Case("malformed-json", raw=b'{"model": "tiny-qwen3", "messages": ['),
    # -- tools ----------------------------------------------------------------------------------
    Case("tool-choice-none", chat(tools=[WEATHER_TOOL], tool_choice="none")),
    Case(
        "named-tool",
        chat(tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=12),
        random={"*": FINISH, "sglang": CALL},
        why_random=NAMED_WHY,
    ),
    Case(
        "named-tool-stream",
        chat(tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=12, stream=True, stream_options=USAGE),
        random={"*": FINISH, "sglang": CALL + SEQUENCE},
        why_random=NAMED_WHY,
    ),
    Case(
        "required-tool",
        chat(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=12),
        random={"*": FINISH + CALL},
        why_random=REQUIRED_WHY,
    ),
    Case(
        "required-tool-stream",
        chat(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=12, stream=True),
        random={"*": FINISH + CALL + SEQUENCE},
        why_random=REQUIRED_WHY,
    ),
    Case(
        "auto-tool",
        chat(tools=[WEATHER_TOOL], max_tokens=12),
        random={"*": FINISH + CALL},
        why_random="`auto`: whether the model calls the tool is what it writes; the simulator answers in "
        "text when the user says 'no tools', the random model writes noise (a `<tool_call>` by chance)",
    ),
    # -- other endpoints ------------------------------------------------------------------------
    Case("models", method="GET", path="/v1/models"),
    Case("health", method="GET", path="/health"),
    Case("version", method="GET", path="/version"),
    Case("unknown-path", method="GET", path="/v1/nothing-here"),
]
