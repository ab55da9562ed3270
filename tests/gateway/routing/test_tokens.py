"""The request's token ids: the model's chat template and tokenizer, cached by piece and conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engines.sim import tokenizer as sim_tokenizer
from engines.sim.prompt import render_chat
from gateway.core.settings import ModelSettings
from gateway.routing.tokens import HfTokenizer, PromptTokens, SimTokenizer, build_prompt_tokens
from policies.kv_blocks import PromptBlocks, seed_for

CHATML = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message.role != 'system' %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on local text (no download), with ChatML specials."""
    root = tmp_path_factory.mktemp("tok")
    corpus = [Path(json.__file__).read_text(), Path(pytest.__file__).read_text()] * 3
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS))
    tok.save(str(root / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def chat(*contents: str, system: str | None = "You are terse.", **body: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, c in enumerate(contents):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": c})
    return {"model": "m", "messages": messages, **body}


def test_the_template_renders_as_apply_chat_template(tok_dir: Path) -> None:
    tok = HfTokenizer(tok_dir)
    assert tok.render(chat("hi there")) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = tok.render(chat("x", tools=tools, chat_template_kwargs={"enable_thinking": False}))
    assert (
        '{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}'
        in text
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    parts = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ],
    }
    assert "<|im_start|>user\na\nb<|im_end|>" in tok.render(parts)


def test_tokenizing_by_pieces_equals_tokenizing_the_whole(tok_dir: Path) -> None:
    tok = HfTokenizer(tok_dir)
    rust = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    body = chat("def f(x):\n    return x  # <|im_end|> in text", "ok, done", "again: import json")
    text = tok.render(body)
    tokens = PromptTokens({"m": tok})
    prompt = tokens.blocks(body)
    assert prompt is not None
    assert prompt.token_ids() == rust.encode(text, add_special_tokens=False).ids
    assert rust.token_to_id("<|im_start|>") in prompt.token_ids()


def test_a_growing_conversation_reuses_its_keys(tok_dir: Path) -> None:
    tokens = PromptTokens({"m": HfTokenizer(tok_dir)})
    long = " ".join(f"word{i}" for i in range(400))
    first = tokens.blocks(chat(long), conversation=7)
    assert first is not None
    first.keys(16)
    second = tokens.blocks(chat(long, "an answer", "a follow-up"), conversation=7)
    assert second is not None
    assert second.keys(16) == PromptBlocks(second.token_ids()).keys(16)
    shared = len(first.keys(16)) - 1
    assert second.keys(16)[:shared] == first.keys(16)[:shared]
    # a salted request lives in another namespace
    salted = tokens.blocks(chat(long, cache_salt="t1"))
    assert salted is not None and salted.keys(16)[0] != first.keys(16)[0]
    # so does a LoRA adapter's (keyed from the adapter's seed), and it does not reuse the base's keys
    adapter = tokens.blocks(chat(long, "an answer", "a follow-up"), conversation=7, lora="tiny-lora")
    assert adapter is not None and adapter.token_ids() == second.token_ids()
    assert adapter.keys(16) == PromptBlocks(adapter.token_ids(), seed=seed_for("tiny-lora")).keys(16)
    assert not set(adapter.keys(16)) & set(second.keys(16))


def test_completions_and_failures(tok_dir: Path) -> None:
    tokens = PromptTokens({"m": HfTokenizer(tok_dir)})
    ids = tokens.blocks({"model": "m", "prompt": [5, 6, 7]})
    assert ids is not None and ids.token_ids() == [5, 6, 7]
    text = tokens.blocks({"model": "m", "prompt": "plain text"})
    assert text is not None and text.tokens > 0
    assert tokens.blocks({"model": "other", "prompt": "x"}) is None
    broken = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"tools": 3},
    }
    assert tokens.blocks(broken) is None  # a template error never fails the request


def test_the_simulators_tokenizer_is_the_simulators() -> None:
    body = chat("hello, world", "fine", "and you?", tools=[{"type": "function", "function": {"name": "g"}}])
    prompt = build_prompt_tokens([ModelSettings(name="m", tokenizer="sim")])
    assert prompt is not None
    blocks = prompt.blocks(body)
    assert blocks is not None
    assert blocks.token_ids() == sim_tokenizer.encode(render_chat(body["messages"], body["tools"]))
    assert isinstance(SimTokenizer().split("<|im_start|>a<|im_start|>b"), list)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_tool_choice_none_is_tokenized_without_the_tools_the_gateway_drops(
    tok_dir: Path, engine: str
) -> None:
    """The dialect sends no tools with `tool_choice: "none"`, so the engine renders none: the tokens
    must match those of the body the engine receives, not of the client's body."""
    from engines.registry import get_dialect

    tools = [{"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]
    body = chat("hello", "fine", "and you?", tools=tools, tool_choice="none")
    sent = json.loads(get_dialect(engine).build_request("chat", dict(body), "m"))
    assert "tools" not in sent
    for tok in (SimTokenizer(), HfTokenizer(tok_dir)):
        tokens = PromptTokens({"m": tok})
        got, want = tokens.blocks(body), tokens.blocks(sent)
        assert got is not None and want is not None
        assert got.token_ids() == want.token_ids()
    with_tools = PromptTokens({"m": SimTokenizer()}).blocks({**body, "tool_choice": "auto"})
    assert with_tools is not None and with_tools.tokens > want.tokens  # tools are rendered otherwise


def _trained(root: Path, pre: Any, specials: list[Any]) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    corpus = [Path(json.__file__).read_text()] * 2
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=500, special_tokens=[]))
    tok.add_special_tokens(specials)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return root


@pytest.mark.parametrize(
    "case",
    ["strips-whitespace", "sentencepiece-prefix-space"],
)
def test_a_tokenizer_whose_pieces_do_not_add_up_is_tokenized_whole(tmp_path: Path, case: str) -> None:
    """Tokenizing between special tokens is only a shortcut where it gives the same ids: a special
    token that strips the whitespace beside it, or a SentencePiece-style space before every input,
    would not, and the tokenizer is then used on the whole text (its own check at load)."""
    from tokenizers import AddedToken

    if case == "strips-whitespace":
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = [AddedToken(s, special=True, rstrip=True, lstrip=True) for s in SPECIALS]
    else:
        pre = pre_tokenizers.Metaspace(prepend_scheme="first")
        specials = [AddedToken(s, special=True) for s in SPECIALS]
    root = _trained(tmp_path, pre, specials)
    tok = HfTokenizer(root)
    rust = Tokenizer.from_file(str(root / "tokenizer.json"))
    body = chat("  two spaces\n", "an answer ", " and more")
    prompt = PromptTokens({"m": tok}).blocks(body)
    assert prompt is not None
    assert prompt.token_ids() == rust.encode(tok.render(body), add_special_tokens=False).ids
    assert tok.split("a<|im_start|>b") == ["a<|im_start|>b"]  # no shortcut for this one


def test_a_long_prompt_is_tokenized_up_to_max_chars_and_cached_by_its_start(tok_dir: Path) -> None:
    tok = HfTokenizer(tok_dir)
    rust = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    doc = " ".join(f"word{i % 977} value{i % 13}" for i in range(4000))  # ~70k characters
    tokens = PromptTokens({"m": tok}, max_chars=20_000)
    first = tokens.blocks(chat(doc + "\n\nWhat is it?", system=None))
    assert first is not None
    whole = rust.encode(tok.render(chat(doc + "\n\nWhat is it?", system=None)), add_special_tokens=False).ids
    assert first.token_ids() == whole[: first.tokens]  # the start, exactly (the cut's tokens dropped)
    assert 0.9 < first.tokens / len(rust.encode(tok.render(chat(doc, system=None))[:20_000]).ids) <= 1
    assert 0.8 < first.length / len(whole) < 1.2  # the whole prompt's length, estimated
    # another question about the same document: its start is the same piece, from the cache
    again = tokens.blocks(chat(doc + "\n\nWho wrote it?", system=None))
    assert again is not None and again.token_ids() == first.token_ids()
    # completions prompts are cut alike
    plain = tokens.blocks({"model": "m", "prompt": doc})
    assert plain is not None and plain.tokens < len(rust.encode(doc).ids) and plain.length > plain.tokens


def test_the_piece_cache_is_bounded_in_bytes(tok_dir: Path) -> None:
    tokens = PromptTokens({"m": HfTokenizer(tok_dir)}, segment_bytes=4096)
    for i in range(50):
        tokens.blocks(chat(f"message {i} " * 40, system=None))
        assert tokens._cached_bytes <= 4096


def _same(a: PromptBlocks | None, b: PromptBlocks | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.data, a.length, a.first_extra, a.keys(64)) == (b.data, b.length, b.first_extra, b.keys(64))


async def test_the_async_path_gives_the_same_blocks_and_offloads_only_long_misses(tok_dir: Path) -> None:
    tok = HfTokenizer(tok_dir)
    long = " ".join(f"word{i % 97} and more" for i in range(900))  # ~16k characters
    bodies = [
        chat("hi"),
        chat(long),
        chat(long, "an answer", "a follow-up"),  # the long piece is cached by then: inline
        chat(long * 4, "cut"),  # cut at max_chars
        chat("x", cache_salt="t1"),
        {"model": "m", "prompt": long},
        {"model": "m", "prompt": long * 4},
        {"model": "m", "prompt": [5, 6, 7]},
        {"model": "other", "prompt": "x"},
    ]
    sync = PromptTokens({"m": tok})
    threaded = PromptTokens({"m": tok})
    try:
        offloaded = []
        for i, body in enumerate(bodies):
            before = threaded.offloaded
            got = await threaded.blocks_async(body, conversation=i // 3)
            assert _same(got, sync.blocks(body, conversation=i // 3)), body.get(
                "messages", body.get("prompt")
            )
            offloaded.append(threaded.offloaded > before)
        assert offloaded == [False, True, False, True, False, True, True, False, False]
    finally:
        threaded.close()


async def test_concurrent_requests_share_the_cache_and_get_their_own_blocks(tok_dir: Path) -> None:
    """Many first turns at once, some sharing a long system prompt: each gets what `blocks` gives,
    and the piece cache (written on the loop only) holds each piece once."""
    import asyncio

    tok = HfTokenizer(tok_dir)
    system = " ".join(f"rule {i} of the house" for i in range(300))
    bodies = [
        chat(f"question {i} " * (50 + 40 * (i % 5)), system=system if i % 2 else None) for i in range(24)
    ]
    threaded = PromptTokens({"m": tok}, offload_chars=512)
    try:
        got = await asyncio.gather(*(threaded.blocks_async(b) for b in bodies))
        for body, prompt in zip(bodies, got, strict=True):
            assert _same(prompt, PromptTokens({"m": tok}).blocks(body))
        assert threaded.offloaded > 0
        assert threaded._cached_bytes == sum(len(v) for v in threaded._segments.values())
    finally:
        threaded.close()


async def test_a_full_worker_or_a_failing_encoding_routes_without_tokens(tok_dir: Path) -> None:
    tok = HfTokenizer(tok_dir)
    long = "a long message " * 400
    full = PromptTokens({"m": tok}, max_pending=0)
    assert await full.blocks_async(chat(long)) is None and full.overflowed == 1
    assert await full.blocks_async(chat("short")) is not None  # inline: no wait, no overflow

    class Broken(HfTokenizer):
        def encode_many(self, texts: Any, *, special: bool) -> list[list[int]]:
            raise RuntimeError("the worker failed")

    broken = PromptTokens({"m": Broken(tok_dir)})
    try:
        assert await broken.blocks_async(chat(long)) is None
        assert await broken.blocks_async(chat("short")) is not None
    finally:
        broken.close()


VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}"
    "{% if part.type == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_image(url: str) -> dict[str, Any]:
    system = "You describe pictures in detail. " * 12
    content = [{"type": "text", "text": "What is in it?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
    }


@pytest.mark.parametrize("tokenizer", ["hf", "sim"])
def test_different_images_share_the_text_before_them_and_no_block_after(
    tok_dir: Path, tmp_path: Path, tokenizer: str
) -> None:
    if tokenizer == "hf":
        (tmp_path / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": VL_TEMPLATE}))
        tokens = PromptTokens({"m": HfTokenizer(tmp_path)})
    else:
        tokens = PromptTokens({"m": SimTokenizer()})
    a = tokens.blocks(with_image("data:image/png;base64,AAAA"))
    b = tokens.blocks(with_image("data:image/png;base64,BBBB"))
    again = tokens.blocks(with_image("data:image/png;base64,AAAA"))
    assert a is not None and b is not None and again is not None
    assert a.keys(4) == again.keys(4)
    shared = [x == y for x, y in zip(a.keys(4), b.keys(4), strict=False)]
    assert shared[0] and not shared[-1]  # the system prompt is one prefix; the image sets them apart
    assert shared == sorted(shared, reverse=True)  # once apart, apart for good
