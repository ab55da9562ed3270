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
Rendering itself (jinja2) runs on every request. docs/routing.md has the measured figures.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from engines.request import prompt_tools
from gateway.core.settings import ModelSettings
from policies.kv_blocks import PromptBlocks, salt_extra, token_bytes

log = logging.getLogger("gateway.tokens")


class Tokenizer(Protocol):
    """One model's template and tokenizer."""

    def render(self, body: Mapping[str, Any]) -> str: ...

    def encode(self, text: str, *, special: bool) -> list[int]:
        """Token ids of `text`; `special`: add the tokenizer's BOS/EOS (completions prompts)."""
        ...


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

    def split(self, text: str) -> list[str]:
        if self._special_re is None:
            return [text]
        return [p for p in self._special_re.split(text) if p]


class PromptTokens:
    """Token blocks of requests, per model, with the caches described in the module docstring."""

    def __init__(
        self,
        tokenizers: Mapping[str, Tokenizer],
        *,
        max_tokens: int = 8192,
        max_chars: int | None = None,
        segment_bytes: int = 16 << 20,
        conversation_entries: int = 1024,
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

    def __bool__(self) -> bool:
        return bool(self._tokenizers)

    @property
    def max_tokens(self) -> int:
        """Tokens of a prompt keyed and matched at most (its start)."""
        return self._max_tokens

    def serves(self, model: str) -> bool:
        return model in self._tokenizers

    def blocks(self, body: Mapping[str, Any], conversation: int | None = None) -> PromptBlocks | None:
        """The request's token blocks, or None (no tokenizer for its model, or it failed: routing
        then goes on without them). `conversation` (the anchor) keys the reuse of earlier keys."""
        model = str(body.get("model", ""))
        tok = self._tokenizers.get(model)
        if tok is None:
            return None
        try:
            data, length = self._data(model, tok, body)
        except Exception as exc:  # a template that raises must not fail the request
            if model not in self._failed:
                self._failed.add(model)
                log.warning("tokenizing for %s failed (%s); KV-event routing skips such requests", model, exc)
            return None
        salt = body.get("cache_salt")
        prompt = PromptBlocks(
            data,
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

    def _data(self, model: str, tok: Tokenizer, body: Mapping[str, Any]) -> tuple[bytes, int | None]:
        """The prompt's token ids as bytes, and its estimated length in tokens when only its first
        `max_chars` characters were tokenized (None when it was tokenized whole)."""
        if "messages" in body:
            text = tok.render(body)
            split: Callable[[str], list[str]] | None = getattr(tok, "split", None)
            return self._pieces(model, tok, text, split(text) if split is not None else [text])
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            prompt = prompt[0]  # a batch is routed by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return token_bytes(prompt), None
        if isinstance(prompt, str):
            cut = len(prompt) > self._max_chars
            ids = tok.encode(prompt[: self._max_chars] if cut else prompt, special=True)
            if not cut:
                return token_bytes(ids), None
            ids = ids[:-_CUT_TOKENS]
            return token_bytes(ids), len(ids) * len(prompt) // self._max_chars
        return b"", None

    def _pieces(self, model: str, tok: Tokenizer, text: str, pieces: list[str]) -> tuple[bytes, int | None]:
        segments = self._segments
        out: list[bytes] = []
        left = self._max_chars
        for piece in pieces:
            cut = len(piece) > left
            if cut:
                piece = piece[:left]
            key = (model, hash(piece), len(piece))
            data = segments.get(key)
            if data is None:
                ids = tok.encode(piece, special=False)
                # a cut piece's last tokens may have merged with what was cut off
                data = token_bytes(ids[:-_CUT_TOKENS] if cut else ids)
                if self._cached_bytes + len(data) > self._segment_bytes:
                    segments.clear()
                    self._cached_bytes = 0
                segments[key] = data
                self._cached_bytes += len(data)
            out.append(data)
            left -= len(piece)
            if cut:
                tokens = sum(len(d) for d in out) // 4
                return b"".join(out), tokens * len(text) // self._max_chars
        return b"".join(out), None


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
    """A message as vLLM hands it to a string-content template: text parts joined by newlines."""
    if not isinstance(message, Mapping):
        return message
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        if len(texts) == len(content):
            return {**message, "content": "\n".join(str(t) for t in texts)}
    return message


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
