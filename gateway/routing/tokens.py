"""The request's token ids as the engine will see them, for matching the engines' KV-cache events.

Per model (`models[].tokenizer` in the config): a directory with Hugging Face's `tokenizer.json` and
`tokenizer_config.json` (its `chat_template`, or a `chat_template.jinja` beside it), or `sim` for the
simulators' tokenizer and template (`engines.sim`). Chat requests are rendered as Hugging Face's
`apply_chat_template` does (a sandboxed jinja2 environment with `trim_blocks`, `lstrip_blocks`, the
loop controls, `tojson`, `raise_exception`, `strftime_now`; `messages`, `tools`,
`add_generation_prompt=True`, the special tokens, the request's `chat_template_kwargs`; no tools with
`tool_choice: "none"`, since the gateway sends none then: `engines.request.prompt_tools`), then
tokenized without adding special tokens, as vLLM tokenizes a rendered chat prompt; completions
prompts are tokenized with them (token-id prompts are taken as they are).

Cost, kept off the hot path where it can be:
- the rendered text is cut at the tokenizer's special tokens (`<|im_start|>`, ...), which a tokenizer
  never merges across, and each piece's ids are remembered (bounded), so a conversation's earlier
  messages, a shared system prompt or tool schemas are tokenized once;
- the block keys of a conversation's previous request are adopted for the prefix both share
  (`PromptBlocks.reuse`, keyed by the conversation's anchor), so a growing conversation hashes only
  its new blocks.
Rendering itself (jinja2) runs on every request. What the piece cache lacks, when it is long (a new
conversation, a new document), is encoded in a worker thread by `PromptTokens.blocks_async` (the
route stage's path): the Rust tokenizer's `encode_batch` releases the GIL, so the event loop serves
the other streams meanwhile. docs/routing.md has the measured figures.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from engines.request import prompt_tools
from gateway.core.settings import ModelSettings
from policies.kv_blocks import PromptBlocks, salt_extra, seed_for, token_bytes
from policies.media import media_digest, media_refs

log = logging.getLogger("gateway.tokens")


class Tokenizer(Protocol):
    """One model's template and tokenizer."""

    def render(self, body: Mapping[str, Any]) -> str: ...

    def encode(self, text: str, *, special: bool) -> list[int]:
        """Token ids of `text`; `special`: add the tokenizer's BOS/EOS (completions prompts)."""
        ...


class ThreadedTokenizer(Tokenizer, Protocol):
    """A tokenizer whose `encode_many` lets other threads run (it releases the GIL), so a worker
    thread can tokenize while the event loop serves other streams."""

    def encode_many(self, texts: Sequence[str], *, special: bool) -> list[list[int]]: ...


class SimTokenizer:
    """The simulators' ChatML-style template and word tokenizer (`engines.sim`)."""

    def render(self, body: Mapping[str, Any]) -> str:
        from engines.sim.prompt import render_chat

        add = body.get("add_generation_prompt") is not False
        return render_chat(list(body.get("messages") or ()), prompt_tools(body), add)

    def encode(self, text: str, *, special: bool) -> list[int]:
        from engines.sim import tokenizer

        return tokenizer.encode(text)

    def split(self, text: str) -> list[str]:
        # the word tokenizer never joins across "<|im_start|>" (a "<" is a token of its own)
        return _split_keep(text, "<|im_start|>")


class HfTokenizer:
    """A Hugging Face tokenizer directory: `tokenizer.json` + `tokenizer_config.json`."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        root = Path(path)
        self._tok = RustTokenizer.from_file(str(root / "tokenizer.json"))
        config_path = root / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        jinja_file = root / "chat_template.jinja"
        if jinja_file.exists():
            template = jinja_file.read_text()
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        self._specials: dict[str, Any] = {}
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                self._specials[name] = value
        self._template = _compile(template) if isinstance(template, str) else None
        specials = sorted(
            (t.content for t in self._tok.get_added_tokens_decoder().values() if t.special),
            key=len,
            reverse=True,
        )
        self._special_re = (
            re.compile("(" + "|".join(re.escape(s) for s in specials) + ")") if specials else None
        )
        if self._special_re is not None and not self._pieces_add_up(specials):
            # e.g. a SentencePiece tokenizer that prefixes every input with a space, or a special
            # token that strips the whitespace beside it: cut pieces would tokenize differently
            log.info("tokenizer %s: pieces between special tokens are not tokenized alone", root)
            self._special_re = None

    def _pieces_add_up(self, specials: Sequence[str]) -> bool:
        """Whether tokenizing the pieces between special tokens one by one gives the whole text's ids,
        on a sample chat rendered with this tokenizer's own template."""
        sample = {
            "messages": [
                {"role": "system", "content": "You are terse.  Use tools.\n"},
                {"role": "user", "content": " What's 2+2? Check:\n\n\tsum(x) ."},
                {"role": "assistant", "content": "It is 4.\n"},
                {"role": "user", "content": "And  in words?"},
            ],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        }
        try:
            text = self.render(sample) if self._template is not None else ""
        except Exception:
            text = ""
        text += f"{specials[0]} after, a special\n{specials[-1]}x  y"
        pieces = self.split(text)
        whole = self.encode(text, special=False)
        return [t for p in pieces for t in self.encode(p, special=False)] == whole

    @property
    def has_template(self) -> bool:
        return self._template is not None

    def render(self, body: Mapping[str, Any]) -> str:
        if self._template is None:
            raise ValueError("the tokenizer has no chat template")
        kwargs = body.get("chat_template_kwargs")
        extra = dict(kwargs) if isinstance(kwargs, Mapping) else {}
        return str(
            self._template.render(
                messages=[_message(m) for m in body.get("messages") or ()],
                tools=_tools(prompt_tools(body)),
                add_generation_prompt=body.get("add_generation_prompt") is not False,
                documents=None,
                **self._specials,
                **extra,
            )
        )

    def encode(self, text: str, *, special: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=special).ids)

    def encode_many(self, texts: Sequence[str], *, special: bool) -> list[list[int]]:
        # `encode_batch` runs with the GIL released (`encode` holds it: measured, docs/routing.md).
        # One text a call: a batch of several is spread over every core by the tokenizer's own
        # thread pool (a new chat's 44 pieces: 1.4 ms wall, 2.5 ms CPU on 2 cores), which would take
        # the event loop's core too; one at a time it is one core (2.9 ms).
        batch = self._tok.encode_batch
        return [list(batch([text], add_special_tokens=special)[0].ids) for text in texts]

    def split(self, text: str) -> list[str]:
        if self._special_re is None:
            return [text]
        return [p for p in self._special_re.split(text) if p]


class _Work:
    """One request's tokenization between its two halves on the event loop: what was rendered and
    found in the piece cache, and the texts still to encode (the expensive part)."""

    __slots__ = ("cut", "data", "keys", "length_of", "model", "special", "texts", "tok")

    def __init__(self, model: str, tok: Tokenizer) -> None:
        self.model = model
        self.tok = tok
        #: the prompt's pieces as token bytes, None where still to encode
        self.data: list[bytes | None] = []
        #: per piece to encode: its index in `data`, its cache key (None: not cached), its text's
        #: index in `texts` (a piece that occurs twice is encoded once)
        self.keys: list[tuple[int, tuple[str, int, int] | None, int]] = []
        self.texts: list[str] = []
        self.special = False
        #: the last piece was cut at `max_chars` (its last tokens dropped)
        self.cut = False
        #: the whole prompt's length in characters, when it was cut (for the length estimate)
        self.length_of = 0

    @property
    def chars(self) -> int:
        """Characters still to encode."""
        return sum(len(t) for t in self.texts)


class PromptTokens:
    """Token blocks of requests, per model, with the caches described in the module docstring.

    `blocks` tokenizes on the calling thread; `blocks_async` (the route stage's) does the same with
    the encoding of what the piece cache lacks moved to a worker thread when it is long (at least
    `offload_chars` characters: a new conversation, a new document), for a tokenizer whose encoding
    releases the GIL (`ThreadedTokenizer`). Rendering, the cache and the keys stay on the event
    loop (the cache is never touched from the worker); the worker only encodes strings. At most
    `max_pending` requests wait for the worker; beyond that a request that would wait is routed
    without its tokens (approximate affinity) rather than queue or block the loop."""

    def __init__(
        self,
        tokenizers: Mapping[str, Tokenizer],
        *,
        max_tokens: int = 8192,
        max_chars: int | None = None,
        segment_bytes: int = 16 << 20,
        conversation_entries: int = 1024,
        offload_chars: int = 2048,
        max_pending: int = 64,
        workers: int = 1,
    ) -> None:
        self._tokenizers = dict(tokenizers)
        self._max_tokens = max_tokens
        # prose and code run 3-4.5 characters a token: 4 a token covers about `max_tokens`
        self._max_chars = max_chars if max_chars is not None else 4 * max_tokens
        # (model, hash, length) of a piece -> its token ids as 32-bit little-endian bytes
        self._segments: dict[tuple[str, int, int], bytes] = {}
        self._segment_bytes = segment_bytes
        self._cached_bytes = 0
        self._previous: OrderedDict[tuple[str, int], PromptBlocks] = OrderedDict()
        self._conversation_entries = conversation_entries
        self._failed: set[str] = set()
        self.offload_chars = offload_chars
        self.max_pending = max_pending
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0
        #: requests tokenized in the worker, and routed without tokens because it was full
        self.offloaded = 0
        self.overflowed = 0

    def __bool__(self) -> bool:
        return bool(self._tokenizers)

    @property
    def max_tokens(self) -> int:
        """Tokens of a prompt keyed and matched at most (its start)."""
        return self._max_tokens

    def serves(self, model: str) -> bool:
        return model in self._tokenizers

    def blocks(
        self, body: Mapping[str, Any], conversation: int | None = None, lora: str | None = None
    ) -> PromptBlocks | None:
        """The request's token blocks, or None (no tokenizer for its model, or it failed: routing
        then goes on without them). `conversation` (the anchor) keys the reuse of earlier keys;
        `lora` is the LoRA adapter the engines serve the model as (its blocks are keyed in the
        adapter's namespace, as the engines cache them)."""
        begun = self._begin(body)
        if begun is None:
            return None
        model, tok, work = begun
        try:
            encoded = [tok.encode(t, special=work.special) for t in work.texts]
        except Exception as exc:
            self._fail(model, exc)
            return None
        return self._end(model, body, work, encoded, conversation, lora)

    async def blocks_async(
        self, body: Mapping[str, Any], conversation: int | None = None, lora: str | None = None
    ) -> PromptBlocks | None:
        """`blocks`, with a long encoding in the worker thread (see the class docstring)."""
        begun = self._begin(body)
        if begun is None:
            return None
        model, tok, work = begun
        many = getattr(tok, "encode_many", None)
        try:
            if many is not None and work.texts and work.chars >= self.offload_chars:
                if self._pending >= self.max_pending:
                    self.overflowed += 1
                    return None
                self._pending += 1
                try:
                    loop = asyncio.get_running_loop()
                    encoded = await loop.run_in_executor(
                        self._pool(), functools.partial(many, work.texts, special=work.special)
                    )
                finally:
                    self._pending -= 1
                self.offloaded += 1
            else:
                encoded = [tok.encode(t, special=work.special) for t in work.texts]
        except Exception as exc:
            self._fail(model, exc)
            return None
        return self._end(model, body, work, encoded, conversation, lora)

    def _begin(self, body: Mapping[str, Any]) -> tuple[str, Tokenizer, _Work] | None:
        """The request's model, its tokenizer and what is left to encode; None without a tokenizer
        for the model or when rendering failed (a template that raises must not fail the request)."""
        model = str(body.get("model", ""))
        tok = self._tokenizers.get(model)
        if tok is None:
            return None
        try:
            return model, tok, self._start(model, tok, body)
        except Exception as exc:
            self._fail(model, exc)
            return None

    def _end(
        self,
        model: str,
        body: Mapping[str, Any],
        work: _Work,
        encoded: Sequence[list[int]],
        conversation: int | None,
        lora: str | None,
    ) -> PromptBlocks | None:
        """The encoded pieces into the cache and the request's blocks (None when that failed)."""
        try:
            data, length = self._finish(work, encoded)
        except Exception as exc:
            self._fail(model, exc)
            return None
        return self._prompt(model, body, data, length, conversation, lora)

    def close(self) -> None:
        """Stop the worker thread (it finishes what it runs)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="gateway-tokenize")
        return self._executor

    def _fail(self, model: str, exc: Exception) -> None:
        if model not in self._failed:
            self._failed.add(model)
            log.warning("tokenizing for %s failed (%s); KV-event routing skips such requests", model, exc)

    def _prompt(
        self,
        model: str,
        body: Mapping[str, Any],
        data: bytes,
        length: int | None,
        conversation: int | None,
        lora: str | None,
    ) -> PromptBlocks:
        salt = body.get("cache_salt")
        prompt = PromptBlocks(
            data,
            seed=seed_for(lora),
            first_extra=salt_extra(salt if isinstance(salt, str) else None),
            max_tokens=self._max_tokens,
            length=length,
        )
        if conversation is not None:
            key = (model, conversation)
            prev = self._previous.get(key)
            if prev is not None:
                prompt.reuse(prev)
            self._previous[key] = prompt
            self._previous.move_to_end(key)
            if len(self._previous) > self._conversation_entries:
                self._previous.popitem(last=False)
        return prompt

    def _start(self, model: str, tok: Tokenizer, body: Mapping[str, Any]) -> _Work:
        """Render the request and look its pieces up: what is left to encode is `work.texts`."""
        work = _Work(model, tok)
        if "messages" in body:
            text = tok.render(body)
            split: Callable[[str], list[str]] | None = getattr(tok, "split", None)
            pieces = split(text) if split is not None else [text]
            segments = self._segments
            queued: dict[tuple[str, int, int], int] = {}
            left = self._max_chars
            for piece in pieces:
                cut = len(piece) > left
                if cut:
                    piece = piece[:left]
                key = (model, hash(piece), len(piece))
                data = segments.get(key)
                if data is None:
                    at = queued.get(key)
                    if at is None or cut:
                        at = queued[key] = len(work.texts)
                        work.texts.append(piece)
                    work.keys.append((len(work.data), key, at))
                work.data.append(data)
                left -= len(piece)
                if cut:
                    work.cut = True
                    work.length_of = len(text)
                    break
            return work
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            prompt = prompt[0]  # a batch is routed by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            work.data.append(token_bytes(prompt))
        elif isinstance(prompt, str):
            work.special = True
            if len(prompt) > self._max_chars:
                work.cut = True
                work.length_of = len(prompt)
                prompt = prompt[: self._max_chars]
            work.keys.append((0, None, 0))
            work.texts.append(prompt)
            work.data.append(None)
        return work

    def _finish(self, work: _Work, encoded: Sequence[list[int]]) -> tuple[bytes, int | None]:
        """The prompt's token ids as bytes, and its estimated length in tokens when only its first
        `max_chars` characters were tokenized (None when it was tokenized whole). The encoded
        pieces enter the cache here (the event loop's thread)."""
        data = work.data
        last = len(data) - 1
        segments = self._segments
        if len(encoded) != len(work.texts):
            raise ValueError("the tokenizer encoded another number of texts than it was given")
        for i, key, at in work.keys:
            ids = encoded[at]
            # a cut piece's last tokens may have merged with what was cut off
            piece = token_bytes(ids[:-_CUT_TOKENS] if work.cut and i == last else ids)
            data[i] = piece
            if key is not None and key not in segments:
                if self._cached_bytes + len(piece) > self._segment_bytes:
                    segments.clear()
                    self._cached_bytes = 0
                segments[key] = piece
                self._cached_bytes += len(piece)
        out = b"".join(d for d in data if d is not None)
        if not work.cut:
            return out, None
        return out, len(out) // 4 * work.length_of // self._max_chars


#: tokens dropped at the end of a prompt cut at `max_chars` (they may tokenize otherwise whole)
_CUT_TOKENS = 2


def tokenizer_problem(model: str, spec: str) -> str | None:
    """Why `spec` cannot be `model`'s tokenizer (no file read but the directory's listing), or None."""
    if spec == "sim" or (Path(spec) / "tokenizer.json").is_file():
        return None
    return (
        f"model {model!r}: tokenizer {spec!r} is not a directory with a tokenizer.json "
        "(a Hugging Face tokenizer directory, or 'sim' for the simulators)"
    )


def load_tokenizer(spec: str, model: str = "?") -> Tokenizer:
    """`sim` or a tokenizer directory; ValueError saying which model and why when it cannot load."""
    if spec == "sim":
        return SimTokenizer()
    problem = tokenizer_problem(model, spec)
    if problem is not None:
        raise ValueError(problem)
    try:
        tok = HfTokenizer(spec)
    except Exception as exc:
        raise ValueError(f"model {model!r}: tokenizer {spec!r} could not be loaded: {exc}") from exc
    if not tok.has_template:
        log.warning(
            "model %r: tokenizer %r has no chat template: its chat requests are routed without their "
            "tokens (approximate affinity)",
            model,
            spec,
        )
    return tok


def _split_keep(text: str, marker: str) -> list[str]:
    parts = text.split(marker)
    out = [parts[0]] if parts[0] else []
    out.extend(marker + p for p in parts[1:])
    return out


def _compile(source: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def _message(message: Any) -> Any:
    """A message as vLLM hands it to a string-content template: text parts joined by newlines. A
    media item is followed by a text part naming its digest, so blocks from the item on are keyed by
    it, as the engines key them (vLLM's multimodal extra keys, SGLang's padded token ids): different
    images never share those blocks, while the text before them still does."""
    if not isinstance(message, Mapping):
        return message
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        if len(texts) == len(content):
            return {**message, "content": "\n".join(str(t) for t in texts)}
        return {**message, "content": _media_marked(content)}
    return message


def _media_marked(content: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in content:
        out.append(part)
        for ref in media_refs(part) if isinstance(part, dict) else ():
            mark = media_digest(ref.url) if ref.url is not None else str(part.get("uuid"))
            out.append({"type": "text", "text": f"<media {mark}>"})
    return out


def _tools(tools: Any) -> Any:
    """Tools as vLLM's request model dumps them: `{"type", "function": {"name", "description",
    "parameters"}}` with the fields the client left out as None."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping):
            fn = tool["function"]
            out.append(
                {
                    "type": tool.get("type", "function"),
                    "function": {
                        "name": fn.get("name"),
                        "description": fn.get("description"),
                        "parameters": fn.get("parameters"),
                        **{k: v for k, v in fn.items() if k not in ("name", "description", "parameters")},
                    },
                }
            )
        else:
            out.append(tool)
    return out


def build_prompt_tokens(models: Sequence[ModelSettings]) -> PromptTokens | None:
    """Tokenizers for the models that name one (loaded once, at start-up), or None."""
    tokenizers = {m.name: load_tokenizer(m.tokenizer, m.name) for m in models if m.tokenizer}
    return PromptTokens(tokenizers) if tokenizers else None
