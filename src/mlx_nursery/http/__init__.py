"""The HTTP layer: routes, streams and error envelopes, on Quart-Trio and Hypercorn.

It knows nothing of MLX, and serves with the serving core (`serving/`): routes read and
check the body, hand it to the serving core's generation choreography (prepared on a
worker thread, run as a job tied to the request's lifetime, `_lifetime.py`) and write its
output as JSON or SSE (`_generate.py`, `_renderers.py`, `_pump.py`). This package exports
what the app (`app.py`) and the server (`server.py`) are built from; the modules stay
private.
"""

from . import (
    _adapter_routes,  # noqa: F401 - registers vLLM's LoRA admin routes on `routes`
    _embeddings_routes,  # noqa: F401 - registers /v1/embeddings on `routes`
    _responses_routes,  # noqa: F401 - registers /v1/responses on `routes`
    _scoring_routes,  # noqa: F401 - registers /v1/rerank and /v1/score on `routes`
    _speech_routes,  # noqa: F401 - registers /v1/audio/speech on `routes`
    _tokenize_routes,  # noqa: F401 - registers /tokenize and /detokenize on `routes`
)
from ._access import AccessPolicy
from ._audio_routes import request_class_for
from ._connections import (
    OPEN_FILES_RESERVE,
    ConnectionCap,
    raise_open_files_limit,
    serve_http,
)
from ._errors import (
    body_left_unread,
    envelope_response,
    error_response,
    leave_body_unread,
)
from ._keepalive import ShieldFinalBody
from ._lifetime import LifetimeHTTPConnection, current_record
from ._limits import HYPERCORN_HEAD_BYTES, RequestLimits
from ._messages_routes import is_messages_route  # registers /v1/messages on `routes`
from ._pump import DROP_CONNECTION
from ._routes import routes
from ._tenancy import tenant_of

__all__ = [
    "DROP_CONNECTION",
    "HYPERCORN_HEAD_BYTES",
    "OPEN_FILES_RESERVE",
    "AccessPolicy",
    "ConnectionCap",
    "LifetimeHTTPConnection",
    "RequestLimits",
    "ShieldFinalBody",
    "body_left_unread",
    "current_record",
    "envelope_response",
    "error_response",
    "is_messages_route",
    "leave_body_unread",
    "raise_open_files_limit",
    "request_class_for",
    "routes",
    "serve_http",
    "tenant_of",
]
