"""What the intakes of the APIs beyond chat that translate nothing into a chat request share
(tokenize, detokenize, rerank, score, audio): the hand-over to the stages after them."""

from __future__ import annotations

from gateway.core.context import RequestContext
from policies.types import RequestFeatures


def hand_over(ctx: RequestContext, features: RequestFeatures) -> None:
    """Leave the routing features (their `prompt_tokens` is what admission reserves) and no stream;
    routing gets no token blocks from the engine's tokenizer (none of these bodies is a prompt the
    engine caches for a later turn)."""
    ctx.extras["features"] = features
    ctx.extras["tokenized"] = True
    ctx.stream = ctx.include_usage = False
