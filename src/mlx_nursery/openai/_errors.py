"""Errors of the OpenAI layer, each with the HTTP status and envelope fields OpenAI uses."""

from __future__ import annotations


class OpenAIError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class InvalidRequest(OpenAIError):
    status = 400
    type = "invalid_request_error"


class ModelNotFound(OpenAIError):
    status = 404
    type = "invalid_request_error"


class ResourceNotFound(OpenAIError):
    status = 404
    type = "invalid_request_error"


class Overloaded(OpenAIError):
    """Retry later: nothing was computed. Carries Retry-After."""

    status = 503
    type = "server_error"
    retry_after = 1


class Unavailable(OpenAIError):
    """The server is shutting down or its engine stopped."""

    status = 503
    type = "server_error"


class RequestTimeout(OpenAIError):
    """The request's deadline passed. Not retried blindly by SDKs (x-should-retry: false)."""

    status = 504
    type = "timeout_error"


class GenerationFailed(OpenAIError):
    """The engine failed this request; details are logged, not returned."""

    status = 500
    type = "server_error"
