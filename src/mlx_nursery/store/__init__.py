"""Durable storage for the Responses API."""

from ._responses import ResponsesStore, StoredResponse

__all__ = ["ResponsesStore", "StoredResponse"]
