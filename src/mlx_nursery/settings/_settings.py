"""`Settings`: every setting, and reading them from flags and the environment.

The fields of what is served and how come first (`ServerSettings`); here follow stored
responses, media, keys, request limits and injected faults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import validators as v

from ..store import StoreLimits
from ._fields import (
    SettingsError,
    audio_default,
    caps_default,
    described,
    engine_default,
    image_default,
    keys,
    media_hosts,
    no_blank_key,
    optional_positive,
    store_default,
)
from ._reading import env_name, flag_name, parse, takes_units
from ._server import ServerSettings

_KEY_SETTINGS = ("api_key", "api_key_file", "admin_key")
"""Set but empty, these are refused: an empty key would serve the API with none."""


@attrs.frozen
class Settings(ServerSettings):
    """Every setting (`ServerSettings`' first), each settable by a flag or `MLX_NURSERY_<FIELD>`."""

    responses_db: str | None = attrs.field(
        default=None,
        metadata=described(
            "SQLite file of stored responses (':memory:' keeps none across restarts), "
            "or a postgresql:// URL that several server processes share",
            none="responses.db in the user data dir",
        ),
    )
    responses_max: int = attrs.field(
        default=store_default("max_responses"),
        validator=v.ge(1),
        metadata=described("stored responses kept; past it, the oldest are evicted"),
    )
    responses_max_bytes: int = attrs.field(
        default=store_default("max_bytes"),
        validator=v.ge(1),
        metadata=described(
            "bytes of stored responses kept; past it, the oldest are evicted", unit="bytes"
        ),
    )
    responses_max_per_key: int = attrs.field(
        default=store_default("max_per_owner"),
        validator=v.ge(1),
        metadata=described(
            "stored responses each API key keeps; past it, that key's oldest are evicted"
        ),
    )
    responses_max_bytes_per_key: int = attrs.field(
        default=store_default("max_bytes_per_owner"),
        validator=v.ge(1),
        metadata=described(
            "bytes of stored responses each API key keeps; past it, that key's oldest are evicted",
            unit="bytes",
        ),
    )
    responses_max_age: float = attrs.field(
        default=store_default("max_age_seconds"),
        validator=v.gt(0),
        metadata=described("seconds a stored response is kept", unit="seconds"),
    )
    max_background: int = attrs.field(
        default=32,
        validator=v.ge(0),
        metadata=described(
            "background responses (Responses API, background: true) unfinished at once,"
            " server-wide; past it, 429 (0: none are taken)"
        ),
    )
    max_background_per_key: int = attrs.field(
        default=8,
        validator=v.ge(1),
        metadata=described(
            "of --max-background, those one API key may have unfinished (with keys set);"
            " past it, 429 for that key"
        ),
    )
    script: str | None = attrs.field(
        default=None,
        metadata=described(
            "a JSON file: the scripted model's script for requests that bring none "
            "(docs/testing-clients.md)"
        ),
    )
    strict_params: bool = attrs.field(
        default=False,
        metadata=described(
            "refuse with a 400 the hints otherwise accepted and ignored "
            "(reasoning_effort, verbosity, ...; see x-ignored-params)"
        ),
    )
    cudnn_attention: bool = attrs.field(
        default=engine_default("cudnn_attention"),
        metadata=described(
            "on CUDA, prefill attention by cuDNN: faster on long contexts, but each new "
            "prompt length builds a graph first (tens of ms)"
        ),
    )
    cuda_graphs: bool = attrs.field(
        default=engine_default("cuda_graphs"),
        metadata=described(
            "on CUDA, let MLX record its command buffers as CUDA graphs: faster for one "
            "stream at a time, slower for a busy batch (building graphs costs the host more)"
        ),
    )
    no_fuse_weights: bool = attrs.field(
        default=False,
        metadata=described(
            "load a text model's q/k/v and gate/up projections as separate matmuls, as "
            "the checkpoint has them (fused by default: fewer kernel launches per step)"
        ),
    )
    no_ragged_attention: bool = attrs.field(
        default=False,
        metadata=described(
            "on CUDA, decode a batch with MLX's masked attention over every row's padded "
            "length (by default a kernel of this server reads each row's own keys)"
        ),
    )
    pack_chunks: bool = attrs.field(
        default=engine_default("pack_chunks"),
        metadata=described(
            "for Llama, Mistral and Qwen models, run a prefill chunk beside decoding "
            "requests inside their decode step's forward (the layers launched once) rather "
            "than as a forward of its own; no measured gain yet, so off by default"
        ),
    )
    skip_warmup: bool = attrs.field(
        default=False,
        metadata=described(
            "report ready without first running what serving runs on dummy prompts (the "
            "first requests then wait while MLX builds its kernels)"
        ),
    )
    warmup_budget: float = attrs.field(
        default=engine_default("warmup_budget_s"),
        validator=v.ge(0),
        metadata=described(
            "seconds the warm-up may take; its remaining phases (larger batches) are then "
            "skipped and their kernels built on first use",
            unit="seconds",
        ),
    )
    max_image_bytes: int = attrs.field(
        default=image_default("max_bytes"),
        validator=v.ge(1),
        metadata=described("largest image file in a request (vision models)", unit="bytes"),
    )
    max_images_per_request: int = attrs.field(
        default=image_default("max_images"),
        validator=v.ge(1),
        metadata=described("images in one request, all messages together (vision models)"),
    )
    max_image_pixels: int = attrs.field(
        default=image_default("max_pixels"),
        validator=v.ge(1),
        metadata=described("largest image in pixels, checked before decoding (vision models)"),
    )
    max_image_pixels_per_request: int = attrs.field(
        default=image_default("max_request_pixels"),
        validator=v.ge(1),
        metadata=described(
            "pixels of a request's images together, each checked before decoding (vision models)"
        ),
    )
    allowed_local_media_path: str | None = attrs.field(
        default=None,
        metadata=described(
            "directory whose files image parts may name by file:// URL", none="none: refused"
        ),
    )
    allowed_media_domains: str | None = attrs.field(
        default=None,
        validator=media_hosts,
        metadata=described(
            "comma-separated host or host:port entries whose http(s) image URLs are fetched "
            "(a bare host: ports 80 and 443 only)",
            none="none: refused",
        ),
    )
    allow_private_media_addresses: bool = attrs.field(
        default=False,
        metadata=described(
            "fetch images from allowed hosts whose names resolve to private, loopback or "
            "link-local addresses (an IP address or localhost entry allows its own anyway)"
        ),
    )
    image_fetch_timeout: float = attrs.field(
        default=image_default("fetch_timeout"),
        validator=v.gt(0),
        metadata=described(
            "seconds an image fetch may wait to connect or between reads", unit="seconds"
        ),
    )
    max_image_fetches: int = attrs.field(
        default=16,
        validator=v.ge(1),
        metadata=described("image fetches at once, server-wide (a request's: at most 4)"),
    )
    max_fetched_image_bytes: int = attrs.field(
        default=512 << 20,
        validator=v.ge(1),
        metadata=described(
            "fetched image bytes held at once, server-wide, until their requests are "
            "prepared; past it, 503",
            unit="bytes",
        ),
    )
    max_audio_bytes: int = attrs.field(
        default=audio_default("max_bytes"),
        validator=v.ge(1),
        metadata=described("largest audio file in a transcription request", unit="bytes"),
    )
    max_audio_seconds: float = attrs.field(
        default=audio_default("max_seconds"),
        validator=v.gt(0),
        metadata=described(
            "longest audio in a transcription request, in seconds once decoded", unit="seconds"
        ),
    )
    api_key: tuple[str, ...] = attrs.field(
        default=(),
        converter=keys,
        validator=no_blank_key,
        metadata=described(
            "a key /v1 requests may send as `Authorization: Bearer KEY` (repeatable)",
            none="none: the API is open",
        ),
    )
    api_key_file: str | None = attrs.field(
        default=None,
        validator=no_blank_key,
        metadata=described(
            "a file of API keys, one per line; blank lines and lines starting with # are not"
            " keys (with --api-key: either is taken)"
        ),
    )
    admin_key: tuple[str, ...] = attrs.field(
        default=(),
        converter=keys,
        validator=no_blank_key,
        metadata=described(
            "a key for the model load and unload routes (repeatable); it is an API key too",
            none="none: open only while the API is",
        ),
    )
    public_metrics: bool = attrs.field(
        default=False,
        metadata=described("with API keys set, /metrics stays open (else it asks for a key)"),
    )
    allowed_origins: str | None = attrs.field(
        default=None,
        metadata=described(
            "comma-separated browser origins whose pages may call the API, or *",
            none="none: no CORS",
        ),
    )
    max_request_bytes: int = attrs.field(
        default=8 << 20,
        validator=v.ge(1),
        metadata=described("largest request body in bytes; past it, 413", unit="bytes"),
    )
    """Past it, 413 before the body is read in full. 8 MiB holds many times the text any
    served context can take, and bounds what one body costs to parse."""
    body_timeout: float = attrs.field(
        default=10.0,
        validator=v.gt(0),
        metadata=described(
            "seconds a request body may take, and one more per --body-min-rate bytes that"
            " arrived; past it, 408 and the connection is closed",
            unit="seconds",
        ),
    )
    body_min_rate: int = attrs.field(
        default=16 << 10,
        validator=v.ge(0),
        metadata=described(
            "bytes per second a long request body must keep up (see --body-timeout)",
            zero="--body-timeout alone",
            unit="bytes",
        ),
    )
    """A client that holds a connection by sending its body slowly (or not at all) pays
    for it in bandwidth: at this rate, holding every connection the server takes costs
    `max_connections` times it."""
    send_timeout: float = attrs.field(
        default=60.0,
        validator=v.gt(0),
        metadata=described(
            "seconds a response write may wait for the client to take its next 64 KiB;"
            " past it the connection is closed (nginx's send_timeout)",
            unit="seconds",
        ),
    )
    """A client that stops reading holds its connection by leaving the server's writes
    waiting, which neither the request timeout (it bounds the compute) nor the keep-alive
    timer (the connection is not idle) ends; a slow reader that takes some bytes within it
    is never cut."""
    max_connections: int = attrs.field(
        default=1024,
        validator=v.ge(1),
        metadata=described(
            "connections open at once; past it, a new one gets a 503 and is closed at once"
        ),
    )

    max_messages: int = attrs.field(
        default=caps_default("max_messages"),
        validator=v.ge(1),
        metadata=described(
            "messages in a chat or Messages request, items in a Responses input, or messages "
            "in a Responses conversation with its previous turns"
        ),
    )
    max_tools: int = attrs.field(
        default=caps_default("max_tools"),
        validator=v.ge(0),
        metadata=described("tools in one request"),
    )
    max_tokens_ceiling: int | None = attrs.field(
        default=caps_default("max_tokens"),
        validator=optional_positive,
        metadata=described(
            "the largest max_tokens a request may ask for; past it, 400", none="the context room"
        ),
    )

    fault_rate: float = attrs.field(
        default=0.0,
        validator=[v.ge(0.0), v.le(1.0)],
        metadata=described(
            "fraction of generation requests that get --fault (chaos tests); 0: none"
        ),
    )
    fault: str = attrs.field(
        default="status:503",
        metadata=described(
            "the injected fault: status:429|500|503, error_after:N or drop_after:N (outputs)"
        ),
    )
    fault_seed: int | None = attrs.field(
        default=None,
        metadata=described("seed of the draw of faulted requests", none="random"),
    )

    def responses_limits(self) -> StoreLimits:
        return StoreLimits(
            max_responses=self.responses_max,
            max_bytes=self.responses_max_bytes,
            max_per_owner=self.responses_max_per_key,
            max_bytes_per_owner=self.responses_max_bytes_per_key,
            max_age_seconds=self.responses_max_age,
        )

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
            if raw == "" and field.name in _KEY_SETTINGS:  # a key meant, none given
                raise SettingsError(f"{env_name(field.name)} is set but empty")
            if raw is not None and raw != "":
                values[field.name] = parse(field, raw, env_name(field.name))
            given = overrides.get(field.name)
            if isinstance(given, str) and takes_units(field):  # a flag's text: `--x 2GiB`
                values[field.name] = parse(field, given, flag_name(field))
            elif given is not None:
                values[field.name] = given
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise SettingsError(str(exc)) from exc
