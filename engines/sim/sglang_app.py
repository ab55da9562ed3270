"""The SGLang dialect: `sglang.launch_server`'s OpenAI server, quirks included (shared/ENGINES.md).

Highlights: flat errors (`{"object": "error", message, type, param, code}`); an unknown model is
served anyway and echoed back (200); bare-hex ids; `content` is `""`, never null; `matched_stop` on
every choice; `finish_reason` in a separate chunk after the content; usage in streams only when asked
(or `--stream-response-default-include-usage`), nulls kept, `reasoning_tokens` at the top of usage;
explicit `null` for `n`, `frequency_penalty`, `presence_penalty`, `logprobs`, `stream` is a 400;
without `--tool-call-parser` tool calls stay as text in `content`.

Shapes checked against a real SGLang 0.5.23 server by `tests/real_engines/test_sim_vs_real.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from engines.sim import asgi, tokenizer
from engines.sim.app_base import Emit, Handler, Prepared, SimApp
from engines.sim.asgi import Scope
from engines.sim.audio import SpeechEndpoints
from engines.sim.config import SimConfig
from engines.sim.embeddings import EmbeddingsEndpoint
from engines.sim.engine import Run
from engines.sim.generator import Constraint, Output, pieces
from engines.sim.plan import (
    chat_logprobs,
    choice_count,
    completion_logprobs,
    hex_id,
    plan_outputs,
    thinking_enabled,
)
from engines.sim.prompt import render_chat
from engines.sim.request import (
    Kind,
    PromptIn,
    RequestError,
    check_types,
    completion_prompts,
    max_tokens_of,
    prompt_form,
    prompt_validation_error,
    response_format_constraint,
)
from engines.sim.scoring import ScoringEndpoints
from engines.sim.sglang_extras import SglangEndpoints
from engines.sim.tools import choose_calls, named_function, tool_name

_NON_NULLABLE = frozenset({"n", "frequency_penalty", "presence_penalty", "logprobs", "stream"})
_TYPES = {
    400: "BadRequestError",  # its request validation's type (a ValueError deeper in says "BadRequest")
    404: "NotFound",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailable",
}
_NULL_DELTA = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}


def sglang_constraint(body: dict[str, Any]) -> Constraint | None:
    """SGLang's constraints: `response_format`, top-level `schema`, `regex`, `ebnf`."""
    rf = response_format_constraint(body.get("response_format"))
    if rf is not None:
        return rf
    schema = body.get("schema")
    if isinstance(schema, str):
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError:
            schema = None
    if isinstance(schema, dict):
        return ("json", schema)
    if isinstance(body.get("regex"), str):
        return ("regex", body["regex"])
    if isinstance(body.get("ebnf"), str):
        return ("grammar", body["ebnf"])
    return None


class SglangApp(SimApp):
    """ASGI app speaking SGLang's dialect."""

    def guarded(self, path: str) -> bool:
        """SGLang's `--api-key` guards every path but health, readiness and metrics."""
        return not path.startswith(("/health", "/ready", "/metrics", "/sim/"))

    def __init__(self, cfg: SimConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(cfg, clock)
        ext = self._ext = SglangEndpoints(cfg, self.engine)
        scoring = ScoringEndpoints(cfg, self.engine, self.error_body)
        speech = SpeechEndpoints(cfg, self.engine, self.error_body)
        self.routes.update(
            {
                ("GET", "/health"): ext.health,
                ("GET", "/health_generate"): ext.health,
                ("GET", "/get_server_info"): ext.server_info,
                ("GET", "/server_info"): ext.server_info,
                ("GET", "/get_model_info"): ext.model_info,
                ("GET", "/model_info"): ext.model_info,
                ("GET", "/get_load"): ext.load,
                ("GET", "/v1/models"): ext.models,
                ("POST", "/tokenize"): ext.tokenize,
                ("POST", "/v1/tokenize"): ext.tokenize,
                ("POST", "/detokenize"): ext.detokenize,
                ("POST", "/v1/detokenize"): ext.detokenize,
                ("POST", "/generate"): ext.native_generate,
                ("POST", "/flush_cache"): ext.flush_cache,
                ("GET", "/flush_cache"): ext.flush_cache,
                ("POST", "/v1/embeddings"): EmbeddingsEndpoint(cfg, self.engine, self.error_body),
                ("POST", "/v1/rerank"): scoring.rerank,
                ("PUT", "/v1/rerank"): scoring.rerank,
                ("POST", "/v1/score"): scoring.score,
                ("POST", "/v1/audio/transcriptions"): speech.transcriptions,
            }
        )
        if cfg.enable_metrics:
            self.routes[("GET", "/metrics")] = ext.metrics

    def fallback(self, scope: Scope) -> Handler | None:
        if scope["method"] == "GET" and scope["path"].startswith("/v1/models/"):
            return self._ext.model
        return None

    # ---- errors --------------------------------------------------------------------------------
    def error_body(
        self, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> bytes:
        return orjson.dumps(
            {
                "object": "error",
                "message": message,
                "type": err_type or _TYPES.get(status, "BadRequestError"),
                "param": param,
                "code": status,
            }
        )

    def stream_error_event(self, message: str, err_type: str, code: int) -> bytes:
        return asgi.sse(
            {"error": {"object": "error", "message": message, "type": err_type, "param": None, "code": code}}
        )

    def context_error(self, prompt_tokens: int, max_tokens: int | None) -> RequestError:
        limit = self.cfg.max_model_len
        if prompt_tokens >= limit or not max_tokens:
            return RequestError(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length ({limit} tokens)."
            )
        return RequestError(
            f"Requested token count exceeds the model's maximum context length of {limit} tokens. You requested "
            f"a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens from the input messages and "
            f"{max_tokens} tokens for the completion. Please reduce the number of tokens in the input messages or "
            f"the completion to fit within the limit."
        )

    # ---- planning ------------------------------------------------------------------------------
    def prepare(self, kind: Kind, body: dict[str, Any]) -> Prepared:
        cfg = self.cfg
        check_types(
            body, kind, "ChatCompletionRequest" if kind == "chat" else "CompletionRequest", _NON_NULLABLE
        )
        stream = body.get("stream") is True
        so = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else None
        include_usage = stream and (
            (so is not None and so.get("include_usage") is True) or cfg.stream_response_default_include_usage
        )
        continuous = stream and so is not None and so.get("continuous_usage_stats") is True
        constraint = sglang_constraint(body)
        extra: dict[str, Any] = {}
        calls: list[tuple[str, Any]] = []
        reasoning = False
        if kind == "chat":
            tool_choice = self._check_tools(body)
            tools = body.get("tools") or None
            messages = body["messages"]
            rendered_tools = tools if tool_choice != "none" else None
            prompt_text = render_chat(messages, rendered_tools, True)
            prompts = [PromptIn(prompt_text, tokenizer.encode(prompt_text))]
            # with another constraint (response_format, schema, regex, ebnf) SGLang drops the tool
            # constraint (a log warning only): the output follows the other constraint, no tool call
            if tools and tool_choice != "none" and constraint is None:
                calls = choose_calls(
                    messages, tools, tool_choice, body.get("parallel_tool_calls") is not False
                )
            extra["tool_mode"] = "named" if isinstance(tool_choice, dict) else tool_choice
            reasoning = thinking_enabled(cfg, body)
            extra["separate_reasoning"] = body.get("separate_reasoning") is not False
        else:
            prompts = self._completion_prompts(body)
            extra["echo"] = body.get("echo") is True
        max_tokens = max_tokens_of(body)
        for q in prompts:  # the tokenizer manager checks each prompt of a batch in turn
            n_prompt = len(q.ids)
            if n_prompt >= cfg.max_model_len or n_prompt + (max_tokens or 0) > cfg.max_model_len:
                raise self.context_error(n_prompt, max_tokens)
        per_prompt = choice_count(body)
        outputs: list[Output] = []
        seed = 0
        for k, q in enumerate(prompts):
            planned_seed, planned = plan_outputs(
                cfg,
                body,
                len(q.ids),
                constraint=constraint,
                calls=calls,
                reasoning=reasoning,
                first_index=k * per_prompt,
            )
            seed = planned_seed if k == 0 else seed
            outputs.extend(planned)
        if calls and not cfg.tool_call_parser:
            for out in outputs:
                self._tools_as_text(out, extra["tool_mode"])
        for out in outputs:
            if out.reasoning and not extra.get("separate_reasoning", True):
                out.content = ["<think>", *out.reasoning, "</think>", *out.content]
                out.reasoning = []
        logprobs = body.get("logprobs")
        top = body.get("top_logprobs") if kind == "chat" else logprobs
        return Prepared(
            kind=kind,
            body=body,
            request_id=hex_id(),
            model=str(body.get("model") or "default"),
            created=int(time.time()),
            prompts=prompts,
            outputs=outputs,
            per_prompt=per_prompt,
            stream=stream,
            include_usage=include_usage,
            continuous_usage=continuous,
            logprobs=bool(logprobs) if kind == "chat" else isinstance(logprobs, int),
            top_logprobs=top if isinstance(top, int) else 0,
            seed=seed,
            extra=extra,
        )

    def _completion_prompts(self, body: dict[str, Any]) -> list[PromptIn]:
        """SGLang 0.5.23's checks of a completions `prompt` (measured, docs/engines.md), then its prompts:
        pydantic's union (negative token ids pass it), then "Prompt cannot be empty" when the prompt
        or every one of its prompts is empty. Some but not all empty is served (the real server's
        scheduler then died on an empty token list; the simulator generates from nothing), and there
        is no limit on the number of prompts."""
        prompt = body.get("prompt")
        invalid = prompt_validation_error(
            prompt,
            lambda member, path: str(
                ("body", "prompt", member, *path) if member != "str" else ("body", "prompt", "str")
            ),
        )
        if invalid is not None:
            raise RequestError(invalid, err_type="Bad Request")
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise RequestError("Prompt cannot be empty")
        return completion_prompts(prompt, prompt_form(prompt))

    @staticmethod
    def _tools_as_text(out: Output, mode: Any) -> None:
        """No parser: auto leaves the raw tool text in content; named/required leave constrained JSON."""
        if not out.tool_calls:
            return
        if mode == "auto":
            text = out.tool_text
        elif mode == "named":
            text = out.tool_calls[0].arguments
        else:
            text = (
                "["
                + ", ".join(f'{{"name": "{c.name}", "parameters": {c.arguments}}}' for c in out.tool_calls)
                + "]"
            )
        out.content = pieces(text)
        out.tool_calls, out.tool_text, out.finish_reason = [], "", "stop"

    def _check_tools(self, body: dict[str, Any]) -> Any:
        tools = body.get("tools")
        tc = body.get("tool_choice")
        if tc is None:
            return "auto" if tools else "none"
        if tc == "required" and not tools:
            raise RequestError("Tools cannot be empty if tool choice is set to required.")
        named = named_function(tc)
        if named is not None:
            if not tools:
                raise RequestError("Tools cannot be empty if tool choice is set to a specific tool.")
            if not any(tool_name(t) == named for t in tools):
                raise RequestError(f"Tool '{named}' not found in tools list.")
        if tc in ("auto", "none") and not tools:
            return "none"
        return tc

    # ---- non-streaming -------------------------------------------------------------------------
    def _usage(self, p: Prepared, prompt_tokens: int, cached: int, completion: int) -> dict[str, Any]:
        # SGLang's UsageProcessor reports the details only when something was cached
        details = {"cached_tokens": cached} if self.cfg.enable_cache_report else None
        reasoning = sum(len(o.reasoning) for o in p.outputs)
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": None,
        }

    def _matched(self, o: Output, streaming: bool = False) -> Any:
        """`matched_stop`: the stop string, else the EOS id on a natural stop. A parsed tool call
        clears it in non-streaming bodies only (SGLang resets `matched` there, not in streams)."""
        if o.stop_str is not None:
            return o.stop_str
        if o.finish_reason == "tool_calls" and not streaming:
            return None
        return self.cfg.eos_token_id if o.eos and o.finish_reason != "length" else None

    def _tool_calls(self, o: Output) -> list[dict[str, Any]] | None:
        if not o.tool_calls:
            return None
        return [
            {
                "id": f"call_{hex_id(12)}",
                "index": k,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for k, c in enumerate(o.tool_calls)
        ]

    def respond(self, p: Prepared, cached: list[int]) -> bytes:
        first_tokens = p.outputs[0].completion_tokens if p.outputs else 0
        choices: list[dict[str, Any]] = []
        for i, o in enumerate(p.outputs):
            if p.kind == "chat":
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": o.text,
                    "reasoning_content": o.reasoning_text or None,
                }
                calls = self._tool_calls(o)
                if calls is not None:  # SGLang 0.5.23 leaves the key out when there are none
                    message["tool_calls"] = calls
                lp = chat_logprobs(o.content, p.top_logprobs, p.seed + i) if p.logprobs else None
                choices.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": lp,
                        "finish_reason": o.finish_reason,
                        "matched_stop": self._matched(o),
                    }
                )
            else:
                text = (p.prompt_of(i).text + o.text) if p.extra.get("echo") else o.text
                lp = completion_logprobs(o.content, p.top_logprobs, p.seed + i) if p.logprobs else None
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": lp,
                        "finish_reason": o.finish_reason,
                        "matched_stop": self._matched(o),
                    }
                )
        return orjson.dumps(
            {
                "id": p.request_id,
                "object": "chat.completion" if p.kind == "chat" else "text_completion",
                "created": p.created,
                "model": p.model,
                "choices": choices,
                # every prompt's tokens and cached tokens once, whatever `n`
                "usage": self._usage(p, p.prompt_tokens, sum(cached), p.completion_tokens),
                "metadata": {
                    "weight_version": "default",
                    # which weights produced which output tokens (one version: all of them)
                    # (of the first choice's request: SGLang reports ret[0]'s meta_info)
                    "weight_versions": [{"version": "default", "start": 0, "end": first_tokens}],
                },
            }
        )

    # ---- streaming -----------------------------------------------------------------------------
    def _deltas(self, p: Prepared, i: int, o: Output) -> list[tuple[Any, Any, bool]]:
        """(delta or text, logprobs, full) per decode step; `full` marks a pydantic-dumped chunk
        (every null kept, `usage: null` included) as SGLang sends for tool calls and completions;
        the others are built like SGLang's `build_sse_content` (unset keys dropped except
        `reasoning_content`, no `usage` key unless continuous usage is on)."""
        if p.kind == "completion":
            texts = list(o.content) or [""]
            if p.extra.get("echo"):
                texts[0] = p.prompt_of(i).text + texts[0]
            return [(t, None, True) for t in texts]
        steps: list[tuple[Any, Any, bool]] = [
            ({"reasoning_content": piece}, None, False) for piece in o.reasoning
        ]
        lps = chat_logprobs(o.content, p.top_logprobs, p.seed + i)["content"] if p.logprobs else None
        for k, piece in enumerate(o.content):
            lp = {"content": [lps[k]]} if lps else None
            steps.append(({"content": piece, "reasoning_content": None}, lp, False))
        for k, call in enumerate(o.tool_calls):
            first = {
                "id": f"call_{hex_id(12)}",
                "index": k,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            steps.append(({**_NULL_DELTA, "tool_calls": [first]}, None, True))
            for a in pieces(call.arguments):
                more = {
                    "id": None,
                    "index": k,
                    "type": "function",
                    "function": {"name": None, "arguments": a},
                }
                steps.append(({**_NULL_DELTA, "tool_calls": [more]}, None, True))
        return steps

    async def stream_prompt(self, p: Prepared, k: int, run: Run, emit: Emit) -> None:
        chat = p.kind == "chat"
        head = p.stream_head()
        indexes = p.choices_of(k)
        n_prompt = len(p.prompts[k].ids)
        produced = dict.fromkeys(indexes, 0)

        def tail(i: int, full: bool, running: bool = True) -> bytes:
            """The end of a chunk; `running`: it carries the running usage under continuous usage
            stats (SGLang 0.5.23 puts it on the generated chunks, not the role or finish chunks), of
            the choice's own prompt."""
            if not (p.continuous_usage and running):
                return b'],"usage":null}\n\n' if full else b"]}\n\n"
            usage = self._usage(p, n_prompt, run.cached_tokens, produced[i])
            return b'],"usage":' + orjson.dumps(usage) + b"}\n\n"

        await run.prefill()
        if chat:
            for i in indexes:
                choice = {
                    "index": i,
                    "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": None,
                    "matched_stop": None,
                }
                await emit(b"data: " + head + orjson.dumps(choice) + tail(i, False, running=False))
        all_steps = [(i, self._deltas(p, i, p.outputs[i])) for i in indexes]
        longest = max((len(steps) for _, steps in all_steps), default=0)
        for t in range(longest):
            if t:  # the first token comes with the prefill, the role chunk too (cost model: ITL × (n − 1))
                await run.step()
            for i, steps in all_steps:
                if t >= len(steps):
                    continue
                o = p.outputs[i]
                produced[i] = min(t + 1, o.completion_tokens)
                delta, lp, full = steps[t]
                if chat:
                    choice = {
                        "index": i,
                        "delta": delta,
                        "logprobs": lp,
                        "finish_reason": None,
                        "matched_stop": None,
                    }
                else:
                    last = t == len(steps) - 1
                    choice = {
                        "index": i,
                        "text": delta,
                        "logprobs": lp,
                        "finish_reason": o.finish_reason if last else None,
                        "matched_stop": self._matched(o, streaming=True) if last else None,
                    }
                await emit(b"data: " + head + orjson.dumps(choice) + tail(i, full))
        if chat:
            for i in indexes:
                o = p.outputs[i]
                produced[i] = o.completion_tokens
                choice = {
                    "index": i,
                    "delta": {"reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": o.finish_reason,
                    "matched_stop": self._matched(o, streaming=True),
                }
                await emit(b"data: " + head + orjson.dumps(choice) + tail(i, False, running=False))

    async def stream_end(self, p: Prepared, cached: list[int], first: int, emit: Emit) -> None:
        if not p.include_usage:
            return
        usage = self._usage(p, p.prompt_tokens, sum(cached), p.completion_tokens)
        if p.kind == "completion":  # its completions stream leaves the details key out
            del usage["completion_tokens_details"]
        await emit(b"data: " + p.stream_head() + b'],"usage":' + orjson.dumps(usage) + b"}\n\n")
