"""Server settings: one attrs class, the one place their defaults are stated.

Every field is settable by a flag (`--max-queue`) or `MLX_NURSERY_<FIELD>`; precedence:
command-line flag, then environment variable, then the default here. Sizes and durations
take units in both (`2GiB`, `90s`: _units.py); `none` or `off` unsets an optional one.
Each field's metadata holds its help line and how its default reads, so `mlx-nursery
serve --help` is built from it and tests/house/test_settings.py checks README's options table
against it. Defaults the engine has too are read from EngineConfig, not restated.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
from attrs import validators as v

from ._units import parse_bytes, parse_seconds
from .engine import KV_BITS, KV_GROUP_SIZES, EmbedderConfig, EngineConfig
from .generation import AudioLimits, ImageLimits, RequestCaps, parse_media_hosts
from .logs import LOG_FORMATS
from .store import StoreLimits

ENV_PREFIX = "MLX_NURSERY_"
LOG_LEVELS = ("debug", "info", "warning", "error")
_HELP = "mlx_nursery.help"
_DAY = 24 * 3600
Unit = Literal["", "bytes", "seconds"]
_KEY_SETTINGS = ("api_key", "api_key_file", "admin_key")
"""Set but empty, these are refused: an empty key would serve the API with none."""


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


@attrs.frozen
class Help:
    """A setting's help line and how its default reads (in --help and README's table)."""

    text: str
    none: str = "none"
    """What None means: the default's reading when it is None."""
    zero: str = ""
    """What 0 means, shown after the 0 when it is the default."""
    unit: Unit = ""
    """How a number reads: bytes as `8 MiB`, whole days of seconds as `30 days`."""


def _help(text: str, *, none: str = "none", zero: str = "", unit: Unit = "") -> dict[str, Help]:
    return {_HELP: Help(text, none, zero, unit)}


def _engine_default(name: str) -> Any:
    """EngineConfig's default for `name`: stated once, in the engine."""
    return attrs.fields_dict(EngineConfig)[name].default


def _image_default(name: str) -> Any:
    """ImageLimits' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(ImageLimits)[name].default


def _audio_default(name: str) -> Any:
    """AudioLimits' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(AudioLimits)[name].default


def _strings(value: str | typing.Iterable[str] | None) -> tuple[str, ...]:
    """A repeatable setting's values: one string (the environment's, comma-separated) or
    several (repeated flags); empty ones dropped."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


def _keys(value: str | typing.Iterable[str] | None) -> tuple[str, ...]:
    """A key setting's values, as `_strings`, but a blank one kept (as "") so that it is
    refused (`_no_blank_key`) rather than dropped: `--api-key ""` would serve the API with
    no key."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items)


def _no_blank_key(
    _: object, attribute: attrs.Attribute[Any], value: str | tuple[str, ...] | None
) -> None:
    values = (value,) if isinstance(value, str) else value or ()
    if any(not item.strip() for item in values):
        raise SettingsError(
            f"{attribute.name} is empty: give a key (or leave the setting out to serve without one)"
        )


def _store_default(name: str) -> Any:
    """StoreLimits' default for `name`: stated once, in the store."""
    return attrs.fields_dict(StoreLimits)[name].default


def _caps_default(name: str) -> Any:
    """RequestCaps' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(RequestCaps)[name].default


def _optional_positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise SettingsError(f"{attribute.name} must be positive, got {value}")


def _media_hosts(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    try:
        parse_media_hosts(value)
    except ValueError as exc:
        raise SettingsError(f"{attribute.name}: {exc}") from None


def _one_of(*choices: int) -> Callable[[object, attrs.Attribute[Any], int | None], None]:
    """A validator: None or one of `choices`, refused with a message that lists them."""

    def validate(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and value not in choices:
            listed = ", ".join(str(choice) for choice in choices)
            raise SettingsError(f"{attribute.name} must be one of {listed}, got {value}")

    return validate


@attrs.frozen
class Settings:
    model: tuple[str, ...] = attrs.field(
        default=(),
        converter=_strings,
        metadata=_help(
            "PATH[=NAME]: a local mlx-lm or mlx-vlm directory, or a repo id already in the HF"
            " cache (never downloaded), served as NAME; repeat it to serve several",
            none="the built-in model",
        ),
    )
    """Empty (and no `models_dir`): the built-in default model (models/default.py)."""
    models_dir: str | None = attrs.field(
        default=None,
        metadata=_help("serve every model directory under this folder, each by its folder name"),
    )
    max_loaded_models: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=_help(
            "models loaded at once; a request for another unloads the least recently used idle"
            " one first"
        ),
    )
    memory_budget: int | None = attrs.field(
        default=None,
        validator=v.optional(v.ge(1)),
        metadata=_help(
            "memory the loaded models may reserve together (weights, KV, prefix cache); each"
            " model's KV defaults to its share of it",
            none="80% of device memory",
            unit="bytes",
        ),
    )
    preload: tuple[str, ...] = attrs.field(
        default=(),
        converter=_strings,
        metadata=_help(
            "a served model name to load at startup (repeatable)", none="the only model if one"
        ),
    )
    host: str = attrs.field(default="127.0.0.1", metadata=_help("address to bind"))
    port: int = attrs.field(
        default=8000, validator=[v.ge(0), v.le(65535)], metadata=_help("port to bind")
    )
    max_concurrency: int = attrs.field(
        default=_engine_default("max_concurrency"),
        validator=v.ge(1),
        metadata=_help("sequences on the device at once; 1 serializes, N batches continuously"),
    )
    max_queue: int = attrs.field(
        default=_engine_default("max_queue"),
        validator=v.ge(0),
        metadata=_help("requests waiting for a lane; past it, 503 with Retry-After"),
    )
    max_queue_per_key: int | None = attrs.field(
        default=None,
        validator=v.optional(v.ge(1)),
        metadata=_help(
            "of --max-queue, the places one API key may hold (with keys set), so that one"
            " client filling the queue leaves the others room; past it, 503 for that key",
            none="half of --max-queue",
        ),
    )
    shared_prefix_cache: bool = attrs.field(
        default=False,
        metadata=_help(
            "with API keys set, share cached prompt prefixes across keys (by default each"
            " key's are its own: a cached-token count could otherwise tell one key what"
            " another's prompts held)"
        ),
    )
    request_timeout: float | None = attrs.field(
        default=600.0,
        validator=_optional_positive,
        metadata=_help("seconds per request, queueing included", none="no limit", unit="seconds"),
    )
    default_max_tokens: int | None = attrs.field(
        default=None,
        validator=_optional_positive,
        metadata=_help("max_tokens when a request gives none", none="context room"),
    )
    """None: up to the model's context length."""
    served_model_name: str | None = attrs.field(
        default=None,
        metadata=_help(
            "the model id clients send as `model`, for a server of one model (several: PATH=NAME)",
            none="the model's name",
        ),
    )
    prefill_batch_size: int = attrs.field(
        default=_engine_default("prefill_batch_size"),
        validator=v.ge(1),
        metadata=_help("prompts prefilled together in one step beside the running batch's decode"),
    )
    prefill_step_size: int = attrs.field(
        default=_engine_default("prefill_step_size"),
        validator=v.ge(1),
        metadata=_help("prompt tokens per prefill chunk; a cancel is honoured between chunks"),
    )
    prefill_chunk_ms: float | None = attrs.field(
        default=_engine_default("prefill_chunk_ms"),
        validator=v.optional(v.ge(0)),
        metadata=_help(
            "milliseconds a prefill chunk may hold the streams decoding beside it: chunks shrink"
            " to fit by the measured cost of a token (by backend: 250 on the CPU, 1000 on a"
            " GPU); 0: always --prefill-step-size",
            none="by backend",
        ),
    )
    embedding_batch_size: int = attrs.field(
        default=attrs.fields_dict(EmbedderConfig)["max_batch_inputs"].default,
        validator=v.ge(1),
        metadata=_help("inputs in one forward of an embedding model, from every request there"),
    )
    embedding_batch_tokens: int = attrs.field(
        default=attrs.fields_dict(EmbedderConfig)["max_batch_tokens"].default,
        validator=v.ge(1),
        metadata=_help(
            "padded tokens in one forward of an embedding model (inputs times the longest)"
        ),
    )
    prompt_cache_bytes: int = attrs.field(
        default=_engine_default("prompt_cache_bytes"),
        validator=v.ge(0),
        metadata=_help("prefix KV cache budget in bytes; 0 disables it", unit="bytes"),
    )
    kv_cache_bytes: int | None = attrs.field(
        default=_engine_default("kv_cache_bytes"),
        validator=v.optional(v.ge(0)),
        metadata=_help(
            "memory for the running requests' KV; arrivals wait and the newest request is"
            " paused rather than outgrow it; it caps the context length served",
            none="from device memory",
            unit="bytes",
        ),
    )
    kv_bits: int | None = attrs.field(
        default=_engine_default("kv_bits"),
        validator=_one_of(*KV_BITS),
        metadata=_help(
            "quantize the KV cache to 4 or 8 bits per value: more tokens in the same memory,"
            " batched as ever",
            none="off",
        ),
    )
    kv_group_size: int = attrs.field(
        default=_engine_default("kv_group_size"),
        validator=_one_of(*KV_GROUP_SIZES),
        metadata=_help("values sharing one scale and bias with --kv-bits (32, 64 or 128)"),
    )
    stream_interval: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata=_help(
            "tokens per streamed chunk after the first; 0: 1, and 1 more per 8 streams beyond 8",
            zero="by load",
        ),
    )
    """Pieces of text (about one per token) per SSE write after the first, which always goes
    at once (vLLM's --stream-interval). 0 adapts to load: 1 while up to 8 streams are open,
    one more per 8 streams beyond (32 streams: 4); see serving/_batching.py."""
    shutdown_grace: float = attrs.field(
        default=10.0,
        validator=v.ge(0),
        metadata=_help("seconds in-flight requests get after SIGTERM/SIGINT", unit="seconds"),
    )
    """In-flight requests still running after it are cancelled with a final error event."""
    on_engine_failure: str = attrs.field(
        default="restart",
        validator=v.in_(("restart", "exit")),
        metadata=_help(
            "when a model's engine thread dies: restart it (load the model again, at most"
            " --engine-restarts times) or exit non-zero for a supervisor to restart the server"
        ),
    )
    engine_restarts: int = attrs.field(
        default=3,
        validator=v.ge(0),
        metadata=_help(
            "restarts of a dead engine per model before the server exits non-zero"
            " (--on-engine-failure restart)"
        ),
    )
    log_level: str = attrs.field(
        default="info",
        validator=v.in_(LOG_LEVELS),
        metadata=_help("debug, info, warning or error; prompts and completions are never logged"),
    )
    log_format: str = attrs.field(
        default="text",
        validator=v.in_(LOG_FORMATS),
        metadata=_help("text, or json: one JSON object per line, a request's line with its fields"),
    )
    responses_db: str | None = attrs.field(
        default=None,
        metadata=_help(
            "SQLite file of stored responses (':memory:' keeps none across restarts), "
            "or a postgresql:// URL that several server processes share",
            none="responses.db in the user data dir",
        ),
    )
    responses_max: int = attrs.field(
        default=_store_default("max_responses"),
        validator=v.ge(1),
        metadata=_help("stored responses kept; past it, the oldest are evicted"),
    )
    responses_max_bytes: int = attrs.field(
        default=_store_default("max_bytes"),
        validator=v.ge(1),
        metadata=_help(
            "bytes of stored responses kept; past it, the oldest are evicted", unit="bytes"
        ),
    )
    responses_max_per_key: int = attrs.field(
        default=_store_default("max_per_owner"),
        validator=v.ge(1),
        metadata=_help(
            "stored responses each API key keeps; past it, that key's oldest are evicted"
        ),
    )
    responses_max_bytes_per_key: int = attrs.field(
        default=_store_default("max_bytes_per_owner"),
        validator=v.ge(1),
        metadata=_help(
            "bytes of stored responses each API key keeps; past it, that key's oldest are evicted",
            unit="bytes",
        ),
    )
    responses_max_age: float = attrs.field(
        default=_store_default("max_age_seconds"),
        validator=v.gt(0),
        metadata=_help("seconds a stored response is kept", unit="seconds"),
    )
    script: str | None = attrs.field(
        default=None,
        metadata=_help(
            "a JSON file: the scripted model's script for requests that bring none "
            "(docs/testing-clients.md)"
        ),
    )
    strict_params: bool = attrs.field(
        default=False,
        metadata=_help(
            "refuse with a 400 the hints otherwise accepted and ignored "
            "(reasoning_effort, verbosity, ...; see x-ignored-params)"
        ),
    )
    cudnn_attention: bool = attrs.field(
        default=_engine_default("cudnn_attention"),
        metadata=_help(
            "on CUDA, prefill attention by cuDNN: faster on long contexts, but each new "
            "prompt length builds a graph first (tens of ms)"
        ),
    )
    skip_warmup: bool = attrs.field(
        default=False,
        metadata=_help(
            "report ready without first running the model on a dummy prompt (the first "
            "requests then wait while MLX builds its kernels)"
        ),
    )
    max_image_bytes: int = attrs.field(
        default=_image_default("max_bytes"),
        validator=v.ge(1),
        metadata=_help("largest image file in a request (vision models)", unit="bytes"),
    )
    max_images_per_request: int = attrs.field(
        default=_image_default("max_images"),
        validator=v.ge(1),
        metadata=_help("images in one request, all messages together (vision models)"),
    )
    max_image_pixels: int = attrs.field(
        default=_image_default("max_pixels"),
        validator=v.ge(1),
        metadata=_help("largest image in pixels, checked before decoding (vision models)"),
    )
    max_image_pixels_per_request: int = attrs.field(
        default=_image_default("max_request_pixels"),
        validator=v.ge(1),
        metadata=_help(
            "pixels of a request's images together, each checked before decoding (vision models)"
        ),
    )
    allowed_local_media_path: str | None = attrs.field(
        default=None,
        metadata=_help(
            "directory whose files image parts may name by file:// URL", none="none: refused"
        ),
    )
    allowed_media_domains: str | None = attrs.field(
        default=None,
        validator=_media_hosts,
        metadata=_help(
            "comma-separated host or host:port entries whose http(s) image URLs are fetched "
            "(a bare host: ports 80 and 443 only)",
            none="none: refused",
        ),
    )
    allow_private_media_addresses: bool = attrs.field(
        default=False,
        metadata=_help(
            "fetch images from allowed hosts whose names resolve to private, loopback or "
            "link-local addresses (an IP address or localhost entry allows its own anyway)"
        ),
    )
    image_fetch_timeout: float = attrs.field(
        default=_image_default("fetch_timeout"),
        validator=v.gt(0),
        metadata=_help(
            "seconds an image fetch may wait to connect or between reads", unit="seconds"
        ),
    )
    max_image_fetches: int = attrs.field(
        default=16,
        validator=v.ge(1),
        metadata=_help("image fetches at once, server-wide (a request's: at most 4)"),
    )
    max_fetched_image_bytes: int = attrs.field(
        default=512 << 20,
        validator=v.ge(1),
        metadata=_help(
            "fetched image bytes held at once, server-wide, until their requests are "
            "prepared; past it, 503",
            unit="bytes",
        ),
    )
    max_audio_bytes: int = attrs.field(
        default=_audio_default("max_bytes"),
        validator=v.ge(1),
        metadata=_help("largest audio file in a transcription request", unit="bytes"),
    )
    max_audio_seconds: float = attrs.field(
        default=_audio_default("max_seconds"),
        validator=v.gt(0),
        metadata=_help(
            "longest audio in a transcription request, in seconds once decoded", unit="seconds"
        ),
    )
    api_key: tuple[str, ...] = attrs.field(
        default=(),
        converter=_keys,
        validator=_no_blank_key,
        metadata=_help(
            "a key /v1 requests may send as `Authorization: Bearer KEY` (repeatable)",
            none="none: the API is open",
        ),
    )
    api_key_file: str | None = attrs.field(
        default=None,
        validator=_no_blank_key,
        metadata=_help(
            "a file of API keys, one per line; blank lines and lines starting with # are not"
            " keys (with --api-key: either is taken)"
        ),
    )
    admin_key: tuple[str, ...] = attrs.field(
        default=(),
        converter=_keys,
        validator=_no_blank_key,
        metadata=_help(
            "a key for the model load and unload routes (repeatable); it is an API key too",
            none="none: open only while the API is",
        ),
    )
    public_metrics: bool = attrs.field(
        default=False,
        metadata=_help("with API keys set, /metrics stays open (else it asks for a key)"),
    )
    allowed_origins: str | None = attrs.field(
        default=None,
        metadata=_help(
            "comma-separated browser origins whose pages may call the API, or *",
            none="none: no CORS",
        ),
    )
    max_request_bytes: int = attrs.field(
        default=8 << 20,
        validator=v.ge(1),
        metadata=_help("largest request body in bytes; past it, 413", unit="bytes"),
    )
    """Past it, 413 before the body is read in full. 8 MiB holds many times the text any
    served context can take, and bounds what one body costs to parse."""
    body_timeout: float = attrs.field(
        default=10.0,
        validator=v.gt(0),
        metadata=_help(
            "seconds a request body may take, and one more per --body-min-rate bytes that"
            " arrived; past it, 408 and the connection is closed",
            unit="seconds",
        ),
    )
    body_min_rate: int = attrs.field(
        default=16 << 10,
        validator=v.ge(0),
        metadata=_help(
            "bytes per second a long request body must keep up (see --body-timeout)",
            zero="--body-timeout alone",
            unit="bytes",
        ),
    )
    """A client that holds a connection by sending its body slowly (or not at all) pays
    for it in bandwidth: at this rate, holding every connection the server takes costs
    `max_connections` times it."""
    max_connections: int = attrs.field(
        default=1024,
        validator=v.ge(1),
        metadata=_help(
            "connections open at once; past it, a new one gets a 503 and is closed at once"
        ),
    )

    max_messages: int = attrs.field(
        default=_caps_default("max_messages"),
        validator=v.ge(1),
        metadata=_help(
            "messages in a chat or Messages request, items in a Responses input, or messages "
            "in a Responses conversation with its previous turns"
        ),
    )
    max_tools: int = attrs.field(
        default=_caps_default("max_tools"),
        validator=v.ge(0),
        metadata=_help("tools in one request"),
    )
    max_tokens_ceiling: int | None = attrs.field(
        default=_caps_default("max_tokens"),
        validator=_optional_positive,
        metadata=_help(
            "the largest max_tokens a request may ask for; past it, 400", none="the context room"
        ),
    )

    fault_rate: float = attrs.field(
        default=0.0,
        validator=[v.ge(0.0), v.le(1.0)],
        metadata=_help("fraction of generation requests that get --fault (chaos tests); 0: none"),
    )
    fault: str = attrs.field(
        default="status:503",
        metadata=_help(
            "the injected fault: status:429|500|503, error_after:N or drop_after:N (outputs)"
        ),
    )
    fault_seed: int | None = attrs.field(
        default=None,
        metadata=_help("seed of the draw of faulted requests", none="random"),
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
                values[field.name] = _parse(field, raw, env_name(field.name))
            given = overrides.get(field.name)
            if isinstance(given, str) and takes_units(field):  # a flag's text: `--x 2GiB`
                values[field.name] = _parse(field, given, flag_name(field))
            elif given is not None:
                values[field.name] = given
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise SettingsError(str(exc)) from exc


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: attrs.Attribute[Any]) -> str:
    """The command-line flag of a setting: `max_queue` -> `--max-queue`."""
    return "--" + field.name.replace("_", "-")


def setting_help(field: attrs.Attribute[Any]) -> Help:
    """A setting's help line and how its default reads, from its metadata."""
    help_: Help = field.metadata[_HELP]
    return help_


def value_type(field: attrs.Attribute[Any]) -> type:
    """The type a setting's value is parsed as: `int | None` -> int."""
    kind = _FIELD_TYPES[field.name]
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    scalar: type = args[0] if args else kind
    return scalar


def repeatable(field: attrs.Attribute[Any]) -> bool:
    """Whether a setting takes several values (`tuple[str, ...]`: a flag given repeatedly)."""
    return typing.get_origin(_FIELD_TYPES[field.name]) is tuple


def shown_default(field: attrs.Attribute[Any]) -> str:
    """How a setting's default reads in --help and README: `2 GiB`, `30 days`, `0 (by load)`."""
    help_ = setting_help(field)
    value = field.default
    if value is None or value == ():
        return help_.none
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == 0 and help_.zero:
        return f"0 ({help_.zero})"
    if help_.unit == "bytes":
        return _bytes(value)
    if help_.unit == "seconds" and value >= _DAY and value % _DAY == 0:
        return f"{value / _DAY:g} days"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bytes(value: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return str(value)


_FIELD_TYPES: dict[str, Any] = typing.get_type_hints(Settings)


def takes_units(field: attrs.Attribute[Any]) -> bool:
    """Whether a setting is a size or a duration, written with units (`2GiB`, `90s`)."""
    return setting_help(field).unit != ""


def _parse(field: attrs.Attribute[Any], raw: str, where: str) -> Any:
    """A setting's value from its text in a flag or an environment variable (`where` names
    it in the error). Raises SettingsError."""
    kind = value_type(field)
    if kind is bool:
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise SettingsError(f"{where}={raw!r} is not a boolean (true or false)")
        return raw.lower() in ("1", "true", "yes", "on")
    if kind in (int, float) and raw.strip().lower() in ("none", "off") and _optional(field):
        return None
    unit = setting_help(field).unit
    try:
        if unit == "bytes":
            return parse_bytes(raw)
        if unit == "seconds":
            return parse_seconds(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        detail = f": {exc}" if unit else ""
        raise SettingsError(f"{where}={raw!r} is not a {_NOUNS[unit]}{detail}") from None
    return raw


def _optional(field: attrs.Attribute[Any]) -> bool:
    return type(None) in typing.get_args(_FIELD_TYPES[field.name])


_NOUNS: dict[Unit, str] = {"": "number", "bytes": "size", "seconds": "duration"}
