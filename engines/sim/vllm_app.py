"""The vLLM dialect: `vllm serve`'s OpenAI server, quirks included (shared/ENGINES.md).

Highlights: nested errors (`{"error": {message, type, param, code}}`, a 400 with a `param` ends its
message with `(parameter=…)`); unknown model → 404; `model` in responses is the served name; non-stream
bodies dump every field, nulls included; streams drop unset fields, carry the last text and
`finish_reason` in the same chunk, and send usage only when `stream_options.include_usage` is true or
with `--enable-force-include-usage`; `max_tokens` past the context is cut to what fits (a prompt past it
is a 400); `auto` tool choice needs `--enable-auto-tool-choice --tool-call-parser`; a named tool call is
its arguments only (structured output on the tool's parameters) and finishes with `"stop"`.

Shapes checked against a real vLLM 0.32 server by `tests/real_engines/test_sim_vs_real.py`.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from engines.sim import asgi, tokenizer
from engines.sim.app_base import Emit, Prepared, SimApp
from engines.sim.asgi import Scope
from engines.sim.audio import SpeechEndpoints
from engines.sim.config import SimConfig
from engines.sim.embeddings import EmbeddingsEndpoint
from engines.sim.engine import Run
from engines.sim.generator import Constraint, Output, ToolCallOut, pieces
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
from engines.sim.tools import choose_calls, named_function, tool_name
from engines.sim.vllm_extras import VllmEndpoints

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


_PYDANTIC_LOC = re.compile(r"'loc': \('body', '([^']+)'\)")
_PYDANTIC_DOTTED = re.compile(r"'loc': '(body[^']*)'")


def system_fingerprint(cfg: SimConfig) -> str:
    """`vllm-<version>-<8 hex>`, as vLLM's default fingerprint mode (the hash of its config)."""
    digest = zlib.crc32(f"{cfg.model}|{cfg.max_model_len}|{cfg.block_size}".encode())
    return f"vllm-{cfg.engine_version}-{digest:08x}"


def structured_outputs_constraint(so: Any) -> Constraint | None:
    """vLLM's native `structured_outputs` field (`json`, `regex`, `choice`, `grammar`, `json_object`)."""
    if not isinstance(so, dict):
        return None
    if so.get("json") is not None:
        schema = so["json"]
        if isinstance(schema, str):
            try:
                schema = orjson.loads(schema)
            except orjson.JSONDecodeError:
                schema = {"type": "object"}
        return ("json", schema)
    if isinstance(so.get("regex"), str):
        return ("regex", so["regex"])
    if isinstance(so.get("choice"), list):
        return ("choice", so["choice"])
    if isinstance(so.get("grammar"), str):
        return ("grammar", so["grammar"])
    if so.get("json_object"):
        return ("json", {"type": "object"})
    return None


#: the paths vLLM's `--api-key` guards (its AuthenticationMiddleware)
_GUARDED = ("/v1", "/v2", "/inference", "/cohere")


class VllmApp(SimApp):
    """ASGI app speaking vLLM's dialect."""

    def guarded(self, path: str) -> bool:
        """vLLM's `--api-key` guards `/v1`, `/v2`, `/inference` and `/cohere` (not health or metrics)."""
        return path.startswith(_GUARDED)

    def __init__(self, cfg: SimConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(cfg, clock)
        ext = VllmEndpoints(cfg, self.engine)
        scoring = ScoringEndpoints(cfg, self.engine, self.error_body)
        speech = SpeechEndpoints(cfg, self.engine, self.error_body)
        self.routes.update(
            {
                ("GET", "/health"): ext.health,
                ("GET", "/ping"): ext.health,
                ("GET", "/version"): ext.version,
                ("GET", "/load"): ext.load,
                ("GET", "/metrics"): ext.metrics,
                ("GET", "/v1/models"): ext.models,
                ("POST", "/tokenize"): ext.tokenize,
                ("POST", "/detokenize"): ext.detokenize,
                ("POST", "/v1/embeddings"): EmbeddingsEndpoint(cfg, self.engine, self.error_body),
                **{("POST", p): scoring.rerank for p in ("/rerank", "/v1/rerank", "/v2/rerank")},
                **{("POST", p): scoring.score for p in ("/score", "/v1/score")},
                ("POST", "/v1/audio/transcriptions"): speech.transcriptions,
                ("POST", "/v1/audio/translations"): speech.translations,
                ("GET", "/kv_event_sources"): ext.kv_event_sources,
                ("POST", "/reset_prefix_cache"): ext.reset_prefix_cache,
            }
        )

    def session_id(self, body: dict[str, Any], scope: Scope) -> str | None:
        """vLLM's session: the body's `session_id`, else the `X-Session-ID` header."""
        sid = body.get("session_id")
        if isinstance(sid, str) and sid:
            return sid
        for key, value in scope["headers"]:
            if key == b"x-session-id" and value:
                return str(value.decode("latin-1"))
        return None

    # ---- errors --------------------------------------------------------------------------------
    def error_body(
        self, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> bytes:
        if status == 400 and param and err_type != "Bad Request" and "(parameter=" not in message:
            message = f"{message} (parameter={param})"  # vLLM 0.32's VLLMValidationError
        err = {
            "message": message,
            "type": err_type or _TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
        return orjson.dumps({"error": err})

    def stream_error_event(self, message: str, err_type: str, code: int) -> bytes:
        return asgi.sse({"error": {"message": message, "type": err_type, "param": None, "code": code}})

    def context_error(self, prompt_tokens: int, max_tokens: int | None) -> RequestError:
        """vLLM 0.32: only a prompt longer than the context is refused (its tokenizer stops one token
        past the limit, hence "at least"); a `max_tokens` that does not fit is cut to what does."""
        limit = self.cfg.max_model_len
        count = min(prompt_tokens, limit + 1)
        qualifier = "at least " if count == limit + 1 else ""
        return RequestError(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
            f"Please reduce the length of the input prompt. (parameter=input_tokens, value={count})",
            param="input_tokens",
        )

    # ---- planning ------------------------------------------------------------------------------
    def prepare(self, kind: Kind, body: dict[str, Any]) -> Prepared:
        cfg = self.cfg
        self._check_types(kind, body)
        lora = self._adapter(body)
        stream, include_usage, continuous = self._usage_asked(body)
        constraint = structured_outputs_constraint(
            body.get("structured_outputs")
        ) or response_format_constraint(body.get("response_format"))
        extra: dict[str, Any] = {"return_token_ids": body.get("return_token_ids") is True}
        prompts, calls, reasoning = self._prompts(kind, body, extra)
        named = extra.get("tool_mode") == "named" and bool(calls)
        per_prompt = choice_count(body)
        first_body, seed, outputs = self._plan(body, prompts, constraint, calls, reasoning, named, per_prompt)
        logprobs = body.get("logprobs")
        top = body.get("top_logprobs") if kind == "chat" else logprobs
        return Prepared(
            kind=kind,
            body=first_body,
            request_id=("chatcmpl-" if kind == "chat" else "cmpl-") + hex_id(),
            model=lora or cfg.served_model_name,  # an adapter answers under its own name
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
            lora=lora,
        )

    def _check_types(self, kind: Kind, body: dict[str, Any]) -> None:
        """The request model's type checks, worded as vLLM 0.32 words pydantic's errors."""
        try:
            check_types(
                body, kind, "ChatCompletionRequest" if kind == "chat" else "CompletionRequest", frozenset()
            )
        except RequestError as err:
            # vLLM 0.32 words pydantic's errors as "N validation error:" with `'loc': 'body.x'`, and
            # names the first field in `param`
            if err.err_type == "Bad Request":
                loc = _PYDANTIC_LOC.search(err.message)
                located = _PYDANTIC_LOC.sub(r"'loc': 'body.\1'", err.message)
                err.message = re.sub(r" for \w+:", ":", located, count=1)
                err.param = f"body.{loc.group(1)}" if loc else None
            raise

    def _adapter(self, body: dict[str, Any]) -> str | None:
        """The LoRA adapter `model` names, None for the base model; 404 for any other name."""
        cfg = self.cfg
        model = body.get("model")
        lora = model if isinstance(model, str) and model in cfg.lora_modules else None
        if model is not None and model != cfg.served_model_name and lora is None:
            raise RequestError(
                f"The model `{model}` does not exist. Valid aliases: {cfg.served_model_name}.",
                status=404,
                param="model",
                err_type="NotFoundError",
            )
        return lora

    def _usage_asked(self, body: dict[str, Any]) -> tuple[bool, bool, bool]:
        """Whether the answer streams, carries a usage chunk, and a running usage on every chunk."""
        cfg = self.cfg
        stream = body.get("stream") is True
        so = body.get("stream_options")
        if so and not stream:
            raise RequestError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        # vLLM 0.32 (`should_include_usage`): `include_usage` defaults to false, so `stream_options: {}`
        # asks for nothing; the force flag turns on the usage chunk and the running usage
        asked = isinstance(so, dict) and bool(so.get("include_usage"))
        include_usage = stream and (cfg.enable_force_include_usage or asked)
        continuous = stream and (
            cfg.enable_force_include_usage
            or (asked and isinstance(so, dict) and so.get("continuous_usage_stats") is True)
        )
        return stream, include_usage, continuous

    def _prompts(
        self, kind: Kind, body: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[list[PromptIn], list[tuple[str, Any]], bool]:
        """The request's prompts, the tool calls the model will make and whether it reasons first;
        the answer's options go into `extra`."""
        cfg = self.cfg
        calls: list[tuple[str, Any]] = []
        reasoning = False
        if kind == "chat":
            tool_choice = self._check_tools(body)
            tools = body.get("tools") or None
            if tool_choice == "none" and cfg.exclude_tools_when_tool_choice_none:
                tools = None
            messages = body["messages"]
            prompt_text = render_chat(messages, tools, body.get("add_generation_prompt") is not False)
            prompts = [PromptIn(prompt_text, tokenizer.encode(prompt_text))]
            if tools and tool_choice != "none":
                calls = choose_calls(
                    messages, tools, tool_choice, body.get("parallel_tool_calls") is not False
                )
            extra["tool_mode"] = "named" if isinstance(tool_choice, dict) else tool_choice
            reasoning = thinking_enabled(cfg, body)
            extra["include_reasoning"] = body.get("include_reasoning") is not False
        else:
            prompts = self._completion_prompts(body)
            extra["echo"] = body.get("echo") is True
        return prompts, calls, reasoning

    def _plan(
        self,
        body: dict[str, Any],
        prompts: list[PromptIn],
        constraint: Constraint | None,
        calls: list[tuple[str, Any]],
        reasoning: bool,
        named: bool,
        per_prompt: int,
    ) -> tuple[dict[str, Any], int, list[Output]]:
        """The outputs of every prompt, one engine request each with its own room in the context; and
        the first one's body and seed."""
        cfg = self.cfg
        outputs: list[Output] = []
        first_body, seed = body, 0
        asked_tokens = max_tokens_of(body)
        for k, q in enumerate(prompts):  # one engine request per prompt, each with its own room
            max_tokens = asked_tokens
            n_prompt = len(q.ids)
            if n_prompt > cfg.max_model_len:
                raise self.context_error(n_prompt, max_tokens)
            room = cfg.max_model_len - n_prompt  # vLLM 0.32's get_max_tokens: cut to what fits
            own = body
            if max_tokens is not None and max_tokens > room:
                own = {**body, "max_completion_tokens": room, "max_tokens": room}
                max_tokens = room
            planned_seed, planned = plan_outputs(
                cfg,
                # a named call is generated whole here and cut below, as vLLM cuts its arguments
                {key: v for key, v in own.items() if key not in ("max_tokens", "max_completion_tokens")}
                if named
                else own,
                n_prompt,
                constraint=constraint,
                calls=calls,
                reasoning=reasoning,
                first_index=k * per_prompt,
            )
            if named:
                for out in planned:
                    _named_call(out, max_tokens)
            if k == 0:
                first_body, seed = own, planned_seed
            outputs.extend(planned)
        return first_body, seed, outputs

    def _completion_prompts(self, body: dict[str, Any]) -> list[PromptIn]:
        """vLLM 0.32's checks of a completions `prompt`, in its order (measured, docs/engines.md), then
        its prompts: its request model's before-validators (an empty string, more prompts than
        `VLLM_MAX_COMPLETION_PROMPTS`), pydantic's union, then the renderer (no prompt, an empty one)."""
        prompt = body.get("prompt")
        if prompt == "":
            raise RequestError(
                "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt"
            )
        form = prompt_form(prompt)
        limit = self.cfg.max_completion_prompts
        if isinstance(prompt, list) and form != "tokens" and len(prompt) > limit:
            raise RequestError(
                f"prompt list length {len(prompt)} exceeds the maximum allowed count of {limit}. To "
                "increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
                param="prompt",
            )
        invalid = prompt_validation_error(
            prompt, lambda _member, path: "'" + ".".join(["body", "prompt", *map(str, path)]) + "'"
        )
        if invalid is not None:
            first = _PYDANTIC_DOTTED.search(invalid)
            raise RequestError(invalid, err_type="Bad Request", param=first.group(1) if first else None)
        if prompt == []:
            raise RequestError("You must pass at least one prompt")
        prompts = completion_prompts(prompt, form)
        if any(not q.ids for q in prompts):  # found by the engine's input processing: after a stream's 200
            raise RequestError("The decoder prompt cannot be empty", in_stream=True)
        return prompts

    def _check_tools(self, body: dict[str, Any]) -> Any:
        """vLLM's tool validation; returns the effective `tool_choice`."""
        cfg = self.cfg
        tools = body.get("tools")
        if "tool_choice" not in body or body["tool_choice"] is None:
            if not tools or "tool_choice" in body:
                return "none"
            tc: Any = "auto"
        else:
            tc = body["tool_choice"]
        if tc == "none":
            return tc
        if tools is None:
            raise RequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if tc not in ("auto", "required") and not isinstance(tc, dict):
            raise RequestError(
                f'Invalid value for `tool_choice`: {tc}! Only named tools, "none", "auto" or "required" are supported.',
                param="tool_choice",
            )
        if tc == "required" and not tools:
            return "none"
        named = named_function(tc)
        if named is not None:
            if not named:
                raise RequestError(
                    "Expected field `name` in `function` in `tool_choice`!", param="tool_choice"
                )
            if not any(tool_name(t) == named for t in tools):
                raise RequestError(
                    "The tool specified in `tool_choice` does not match any of the specified `tools`",
                    param="tool_choice",
                )
        if tc == "auto" and not (cfg.enable_auto_tool_choice and cfg.tool_call_parser):
            raise RequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        if tc == "required" and not cfg.tool_call_parser:
            raise RequestError('tool_choice="required" requires --tool-call-parser to be set')
        if named and not cfg.tool_call_parser:
            raise RequestError(f'tool_choice=function "{named}" requires --tool-call-parser to be set')
        return tc

    # ---- non-streaming -------------------------------------------------------------------------
    def _usage(self, p: Prepared, cached: int, completion: int) -> dict[str, Any]:
        """Usage over every prompt; `cached`: the cached tokens vLLM reports (one prompt's)."""
        n = p.prompt_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": n,
            "total_tokens": n + completion,
            "completion_tokens": completion,
        }
        details: dict[str, Any] | None = None
        if self.cfg.enable_prompt_tokens_details:
            details = {
                "cached_tokens": cached,
                # chat reports the tokens it newly cached (whole blocks); completions do not
                "created_cache_tokens": self._created_cache_tokens(p, cached) if p.kind == "chat" else None,
                "multimodal_tokens": None,
            }
        usage["prompt_tokens_details"] = details
        usage["completion_tokens_details"] = None
        return usage

    def _created_cache_tokens(self, p: Prepared, cached: int) -> int:
        """The prompt's whole blocks that were not cached before (what this request added)."""
        if not self.cfg.prefix_caching:
            return 0
        block = self.cfg.block_size
        return max(0, len(p.prompt_ids) // block * block - cached)

    def respond(self, p: Prepared, cached: list[int]) -> bytes:
        ids = p.extra.get("return_token_ids", False)
        choices: list[dict[str, Any]] = []
        for i, o in enumerate(p.outputs):
            token_ids = tokenizer.encode(o.text) if ids else None
            if p.kind == "chat":
                choices.append(self._chat_choice(p, i, o, token_ids))
            else:
                prompt = p.prompt_of(i)
                text = (prompt.text + o.text) if p.extra.get("echo") else o.text
                lp = completion_logprobs(o.content, p.top_logprobs, p.seed + i) if p.logprobs else None
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": lp,
                        "finish_reason": o.finish_reason,
                        "stop_reason": o.stop_str,
                        "token_ids": token_ids,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt.ids if ids else None,
                        "routed_experts": None,
                    }
                )
        body: dict[str, Any] = {
            "id": p.request_id,
            "object": "chat.completion" if p.kind == "chat" else "text_completion",
            "created": p.created,
            "model": p.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": system_fingerprint(self.cfg),
            # a batch reports the cached tokens of its last prompt (vLLM 0.32)
            "usage": self._usage(p, cached[-1], p.completion_tokens),
        }
        if p.kind == "chat":
            body.update(
                prompt_logprobs=None, prompt_token_ids=p.prompt_ids if ids else None, prompt_text=None
            )
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return orjson.dumps(body)

    def _chat_choice(self, p: Prepared, i: int, o: Output, token_ids: list[int] | None) -> dict[str, Any]:
        mode = p.extra.get("tool_mode")
        content: str | None = o.text
        if o.tool_calls:
            content = None if mode == "auto" else ""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if o.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"chatcmpl-tool-{hex_id()}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in o.tool_calls
            ]
        message["reasoning"] = o.reasoning_text if o.reasoning and p.extra.get("include_reasoning") else None
        lp = chat_logprobs(o.content, p.top_logprobs, p.seed + i) if p.logprobs else None
        return {
            "index": i,
            "message": message,
            "logprobs": lp,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_str,
            "token_ids": token_ids,
            "routed_experts": None,
        }

    # ---- streaming -----------------------------------------------------------------------------
    def _deltas(self, p: Prepared, i: int, o: Output) -> list[tuple[dict[str, Any], Any]]:
        steps: list[tuple[dict[str, Any], Any]] = []
        if p.kind == "completion":
            text_pieces = list(o.content)
            if p.extra.get("echo"):
                echoed = p.prompt_of(i).text
                text_pieces = [echoed + (text_pieces[0] if text_pieces else ""), *text_pieces[1:]]
            lps = completion_logprobs(o.content, p.top_logprobs, p.seed + i) if p.logprobs else None
            for k, piece in enumerate(text_pieces or [""]):
                lp = None
                if lps is not None and k < len(lps["tokens"]):
                    lp = {key: val[k : k + 1] for key, val in lps.items()}
                steps.append(({"text": piece}, lp))
            return steps
        if p.extra.get("include_reasoning"):
            steps.extend(({"reasoning": piece}, None) for piece in o.reasoning)
        lps = chat_logprobs(o.content, p.top_logprobs, p.seed + i)["content"] if p.logprobs else None
        for k, piece in enumerate(o.content):
            steps.append(({"content": piece}, {"content": [lps[k]]} if lps else None))
        named = p.extra.get("tool_mode") == "named"
        for k, call in enumerate(o.tool_calls):
            args = pieces(call.arguments)
            head: dict[str, Any] = {
                "index": k,
                "id": f"chatcmpl-tool-{hex_id()}",
                "type": "function",
                "function": {"name": call.name},
            }
            if named and args:  # the named path streams the first piece of the arguments with the head
                head["function"]["arguments"] = args.pop(0)
            steps.append(({"tool_calls": [head]}, None))
            steps.extend(({"tool_calls": [{"index": k, "function": {"arguments": a}}]}, None) for a in args)
        if not steps:
            steps.append(({"content": ""}, None))
        return steps

    async def stream_prompt(self, p: Prepared, k: int, run: Run, emit: Emit) -> None:
        chat = p.kind == "chat"
        head = p.stream_head()
        n_prompt = len(p.prompts[k].ids)
        indexes = p.choices_of(k)
        await run.prefill()
        if chat:
            for i in indexes:
                role_choice = {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                tail = b'],"prompt_token_ids":null,"prompt_text":null'
                if p.continuous_usage:
                    tail = b"]," + _running_usage(n_prompt, 0) + tail[1:]
                await emit(b"data: " + head + orjson.dumps(role_choice) + tail + b"}\n\n")
        all_steps = [(i, self._deltas(p, i, p.outputs[i])) for i in indexes]
        longest = max(len(steps) for _, steps in all_steps)
        for t in range(longest):
            if t:  # the first token comes with the prefill, the role chunk too (cost model: ITL × (n − 1))
                await run.step()
            for i, steps in all_steps:
                if t >= len(steps):
                    continue
                o = p.outputs[i]
                delta, lp = steps[t]
                last = t == len(steps) - 1
                key = "delta" if chat else "text"
                choice: dict[str, Any] = {
                    "index": i,
                    key: delta if chat else delta["text"],
                    "logprobs": lp,
                    "finish_reason": o.finish_reason if last else None,
                }
                if last or not chat:
                    choice["stop_reason"] = o.stop_str
                if not chat:
                    choice["prompt_token_ids"] = None
                choice["token_ids"] = None
                tail = b"]"
                if p.continuous_usage:  # per choice, over its own prompt
                    done = min(t + 1, o.completion_tokens) if not last else o.completion_tokens
                    tail += b"," + _running_usage(n_prompt, done)
                if last and not p.include_usage:  # every terminal chunk, when no usage chunk follows
                    tail += b',"system_fingerprint":' + orjson.dumps(system_fingerprint(self.cfg))
                await emit(b"data: " + head + orjson.dumps(choice) + tail + b"}\n\n")

    async def stream_end(self, p: Prepared, cached: list[int], first: int, emit: Emit) -> None:
        if not p.include_usage:
            return
        n_prompt = p.prompt_tokens
        c = p.completion_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + c,
            "completion_tokens": c,
        }
        if self.cfg.enable_prompt_tokens_details:
            # a batch's stream reports the cached tokens of the prompt whose output came first
            details: dict[str, Any] = {"cached_tokens": cached[first]}
            if p.kind == "chat":  # nulls are dropped in streams, and completions leave it unset
                details["created_cache_tokens"] = self._created_cache_tokens(p, cached[first])
            usage["prompt_tokens_details"] = details
        fingerprint = orjson.dumps(system_fingerprint(self.cfg))
        await emit(
            b"data: " + p.stream_head() + b'],"usage":' + orjson.dumps(usage)
            + b',"system_fingerprint":' + fingerprint + b"}\n\n"
        )  # fmt: skip


def _running_usage(n_prompt: int, done: int) -> bytes:
    """`"usage":{…}` of a chunk with continuous usage stats (vLLM sets the details key to null)."""
    usage = {
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + done,
        "completion_tokens": done,
        "completion_tokens_details": None,
    }
    return b'"usage":' + orjson.dumps(usage)


def _named_call(out: Output, max_tokens: int | None) -> None:
    """A named `tool_choice`: vLLM constrains the output to the tool's parameters, so the output *is*
    the arguments (no `<tool_call>` wrapper), always parsed into `tool_calls`, cut at `max_tokens`
    (`finish_reason: "length"`, arguments left unfinished), else `"stop"`."""
    if not out.tool_calls:
        return
    call = out.tool_calls[0]
    args = pieces(call.arguments)
    budget = len(args) if max_tokens is None else max_tokens
    kept = len(out.reasoning) + len(args)
    if kept > budget:
        args = args[: max(0, budget - len(out.reasoning))]
        out.finish_reason = "length"
    else:
        out.finish_reason = "stop"
    call = ToolCallOut(call.name, "".join(args))
    out.tool_calls = [call]
    out.tool_text = call.arguments
    out.content = []
    out.completion_tokens = min(kept, budget)
