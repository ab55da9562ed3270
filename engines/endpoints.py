"""The engine endpoints beyond chat and completions: each one's request builder, the same call for
both dialects (the engine's name picks its field rules: `engines.embeddings`, `engines.tokenize`,
`engines.scoring`, `engines.audio`), and each engine's paths (SGLang serves no translations).

A dialect hands a request for one of these endpoints to its builder here; their answers are read by
the client API's own answer (gateway/apis/), through the functions of the same modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.audio import build_audio_request
from engines.base import Endpoint
from engines.embeddings import build_embeddings_request
from engines.scoring import build_rerank_request, build_score_request
from engines.tokenize import build_detokenize_request, build_tokenize_request

#: (validated body, served model name, engine name) → the engine's request body
Builder = Callable[[dict[str, Any], str, Any], bytes]

BUILDERS: dict[Endpoint, Builder] = {
    "embeddings": build_embeddings_request,
    "tokenize": build_tokenize_request,
    "detokenize": build_detokenize_request,
    "rerank": build_rerank_request,
    "score": build_score_request,
    "transcriptions": build_audio_request,
    "translations": build_audio_request,
}

_OPENAI: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "transcriptions": "/v1/audio/transcriptions",
}
# vLLM's canonical paths (it logs a deprecation warning for each request to its /v1/score)
VLLM_PATHS: dict[Endpoint, str] = {
    **_OPENAI,
    "tokenize": "/tokenize",
    "detokenize": "/detokenize",
    "rerank": "/rerank",
    "score": "/score",
    "translations": "/v1/audio/translations",
}
SGLANG_PATHS: dict[Endpoint, str] = {
    **_OPENAI,
    "tokenize": "/v1/tokenize",
    "detokenize": "/v1/detokenize",
    "rerank": "/v1/rerank",
    "score": "/v1/score",
}
