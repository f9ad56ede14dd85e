"""What the server needs of a Responses store, and the one place that picks the backend.

SQLite is the embedded default (one process, nothing to run beside it); PostgreSQL lets
several server processes behind a load balancer share `previous_response_id`, retrieve and
delete. Both keep the same rows, limits and cancellation behaviour.
"""

from __future__ import annotations

from typing import Any, Protocol

from ._postgres import PostgresResponsesStore, is_postgres_url
from ._responses import ResponsesStore
from ._rows import StoredResponse, StoreLimits


class ResponsesStorage(Protocol):
    """A Responses store. Cancellation, for every method: a checkpoint; cancelled before its
    thread starts, it does nothing and raises `Cancelled`; once started it is never abandoned
    (a `put` under way when its client leaves still stores): see `ResponsesStore`."""

    @property
    def path(self) -> str:
        """Where the store is, for messages: a file path, or a URL without its password."""
        ...

    @property
    def runner(self) -> str:
        """This server process, as the unfinished responses it runs name it (a random id
        made with the store)."""
        ...

    async def open(self) -> None:
        """Open the store, creating its schema if missing; raises if it cannot."""
        ...

    async def close(self) -> None:
        """Close the store; later calls raise until it is opened again."""
        ...

    async def put(self, record: StoredResponse) -> None:
        """Store `record` (replacing one with its id), evicting past the limits: the age,
        then its owner's count and bytes, then the whole store's (`_rows.py`); committed
        when it returns."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, whoever owns it (the caller checks `owner`), or None (never
        stored, deleted, evicted, or too old)."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Delete a response (and its events); whether it was there."""
        ...

    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        """Add a streamed response's events, each numbered by its `sequence_number` (one
        already stored under its number stays as it was), if the response is still stored;
        counted in its bytes; committed when it returns."""
        ...

    async def events(self, response_id: str, after: int) -> list[dict[str, Any]]:
        """The response's stored events numbered past `after`, in order."""
        ...

    async def unfinished(self) -> list[str]:
        """The ids of responses left unfinished (`StoredResponse.runner` set) by a server
        process that is no longer running: never this store's `runner`'s, nor those of
        another live process sharing a PostgreSQL store."""
        ...


def responses_store_at(location: str, limits: StoreLimits) -> ResponsesStorage:
    """The store `--responses-db` names, not yet open: a `postgresql://` or `postgres://` URL
    is a PostgreSQL database; anything else is a SQLite file (or `:memory:`)."""
    if is_postgres_url(location):
        return PostgresResponsesStore(location, limits)
    return ResponsesStore(location, limits)
