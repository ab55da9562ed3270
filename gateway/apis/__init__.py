"""The client APIs beyond OpenAI's chat and completions: OpenAI's Responses API (with its store),
embeddings, and Anthropic's Messages API.

Each API is translated into the neutral chat request right after the parse stage (embeddings keep
their own request), so authentication, sanitising, admission, routing — the same prefix keys: a
conversation keeps its cache whichever API it uses — and the proxy stage are the chat path's. The
answer is written back in the API's shape by its encoder in `engines/` (`engines.responses`,
`engines.anthropic`, `engines.embeddings`) through `ctx.answer`; errors by `ctx.render_error`.

The interface the root uses (docs/architecture.md): `Apis`, `ApiRoute`, `ApisSettings`.
"""

from gateway.apis.assembly import ApiRoute, Apis
from gateway.apis.settings import ApisSettings

__all__ = ["ApiRoute", "Apis", "ApisSettings"]
