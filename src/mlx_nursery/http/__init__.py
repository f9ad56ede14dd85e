"""The HTTP layer: routes, jobs, streams and error envelopes, on Quart-Trio and Hypercorn.

It knows nothing of MLX: routes read and check the body, hand it to the OpenAI layer on a
worker thread, run the generation as a job (`_jobs.py`) tied to the request's lifetime
(`_lifetime.py`), and write JSON or SSE (`_pump.py`). This package exports what the app
(`app.py`) and the server (`server.py`) are built from; the modules stay private.
"""

from . import (
    _embeddings_routes,  # noqa: F401 - registers /v1/embeddings on `routes`
    _responses_routes,  # noqa: F401 - registers /v1/responses on `routes`
)
from ._audio_routes import request_class_for
from ._drop import ConnectionDrops
from ._errors import envelope_response, error_response, internal_error, log_failure
from ._faults import parse_fault
from ._keepalive import ShieldFinalBody
from ._lifetime import LifetimeHTTPConnection, current_record
from ._limits import HYPERCORN_HEAD_BYTES, RequestLimits
from ._messages_routes import is_messages_route  # registers /v1/messages on `routes`
from ._model_sources import model_sources
from ._routes import routes
from ._service import RequestProcessors, Service, default_script
from ._tenancy import ANONYMOUS, Tenant, current_tenant, tenant_of

__all__ = [
    "ANONYMOUS",
    "HYPERCORN_HEAD_BYTES",
    "ConnectionDrops",
    "LifetimeHTTPConnection",
    "RequestLimits",
    "RequestProcessors",
    "Service",
    "ShieldFinalBody",
    "Tenant",
    "current_record",
    "current_tenant",
    "default_script",
    "envelope_response",
    "error_response",
    "internal_error",
    "is_messages_route",
    "log_failure",
    "model_sources",
    "parse_fault",
    "request_class_for",
    "routes",
    "tenant_of",
]
