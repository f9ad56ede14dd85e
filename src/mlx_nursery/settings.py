"""Server settings: one attrs class; every field settable by a flag or `MLX_NURSERY_<FIELD>`.

Precedence: command-line flag, then environment variable, then the default here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import validators as v

ENV_PREFIX = "MLX_NURSERY_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def _optional_positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise SettingsError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class Settings:
    model: str | None = None
    """A local mlx-lm directory or a cached HF repo id; None serves the built-in default model."""
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8000, validator=[v.ge(0), v.le(65535)])
    max_concurrency: int = attrs.field(default=8, validator=v.ge(1))
    """Sequences on the device at once: 1 = strict serialization, N = continuous batching."""
    max_queue: int = attrs.field(default=64, validator=v.ge(0))
    """Requests that may wait for a lane; past it, 503 with Retry-After."""
    request_timeout: float | None = attrs.field(default=600.0, validator=_optional_positive)
    """Seconds for a whole request, queueing included; None for no limit."""
    default_max_tokens: int | None = attrs.field(default=None, validator=_optional_positive)
    """max_tokens when a request gives none; None: up to the model's context length."""
    served_model_name: str | None = None
    prompt_cache_bytes: int = attrs.field(default=2 << 30, validator=v.ge(0))
    stream_interval: int = attrs.field(default=0, validator=v.ge(0))
    """Pieces of text (about one per token) per SSE write after the first, which always goes
    at once (vLLM's --stream-interval). 0 adapts to load: 1 while up to 8 streams are open,
    one more per 8 streams beyond (32 streams: 4); see http/_batching.py."""
    shutdown_grace: float = attrs.field(default=10.0, validator=v.ge(0))
    """Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are cancelled."""
    log_level: str = attrs.field(default="info", validator=v.in_(LOG_LEVELS))
    responses_db: str | None = None
    """SQLite file of the Responses store; None: responses.db in the user data directory;
    ":memory:" keeps nothing across restarts."""
    responses_max: int = attrs.field(default=10_000, validator=v.ge(1))
    """Stored responses kept; the oldest are evicted past it."""
    responses_max_age: float = attrs.field(default=30 * 24 * 3600.0, validator=v.gt(0))
    """Seconds a stored response is kept."""
    strict_params: bool = False
    """Refuse with a 400 the hints this server accepts and ignores (reasoning_effort, ...)."""
    max_request_bytes: int = attrs.field(default=8 << 20, validator=v.ge(1))
    """Largest request body; past it, 413 before the body is read in full. 8 MiB holds many
    times the text any served context can take, and bounds what one body costs to parse."""

    def responses_db_path(self) -> str:
        if self.responses_db:
            return self.responses_db
        import platformdirs

        return str(platformdirs.user_data_path("mlx-nursery") / "responses.db")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from `MLX_NURSERY_*` variables; `overrides` (not None) take precedence."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in attrs.fields(cls):
            raw = environ.get(env_name(field.name))
            if raw is not None and raw != "":
                values[field.name] = _parse(field, raw)
        values.update({k: val for k, val in overrides.items() if val is not None})
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise SettingsError(str(exc)) from exc


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _parse(field: attrs.Attribute[Any], raw: str) -> Any:
    kind = str(field.type)
    if kind == "bool":
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise SettingsError(f"{env_name(field.name)}={raw!r} is not a boolean (true or false)")
        return raw.lower() in ("1", "true", "yes", "on")
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return None if raw.lower() in ("none", "off") else float(raw)
    except ValueError:
        raise SettingsError(f"{env_name(field.name)}={raw!r} is not a number") from None
    return raw
