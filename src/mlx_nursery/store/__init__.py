"""Durable storage for the Responses API: SQLite embedded, or PostgreSQL shared by replicas."""

from ._postgres import PostgresResponsesStore, StoreUnavailable
from ._responses import ResponsesStore
from ._rows import StoredResponse, StoreLimits
from ._storage import ResponsesStorage, responses_store_at

__all__ = [
    "PostgresResponsesStore",
    "ResponsesStorage",
    "ResponsesStore",
    "StoreLimits",
    "StoreUnavailable",
    "StoredResponse",
    "responses_store_at",
]
