"""Who may call the API: API keys on every API route (/v1, and vLLM's /tokenize, /detokenize,
/rerank and /score), and CORS for browsers.

Keys are compared in constant time against every key the server holds (so the time taken
says nothing of which key, or how much of one, matched), and only `Authorization: Bearer`
or `x-api-key` carries them, as OpenAI's and Anthropic's APIs and SDKs do. `/health`
stays open for load balancers; `/metrics` asks for a key too unless `--public-metrics` (any
key: its series carry no request's content, and a scraper should not need an admin key,
which loads and unloads models). A browser's preflight (OPTIONS with
`Access-Control-Request-Method`) is answered before any key is asked for: browsers send no
credentials on it.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Literal

import attrs

from ..settings import Settings, SettingsError

PREFLIGHT_MAX_AGE = 600
ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOWED_HEADERS = "authorization, x-api-key, anthropic-version, content-type, x-request-id"
EXPOSED_HEADERS = (
    "x-request-id, request-id, x-ignored-params, x-truncated-messages, retry-after,"
    " retry-after-ms, x-should-retry"
)
"""The headers of ours a page may read (beside the CORS-safelisted ones): the SDKs' retry
headers too, which a page's SDK reads as a server's SDK does."""
UNVERSIONED = ("/tokenize", "/detokenize", "/rerank", "/score")
"""API routes also served without /v1 (vLLM's paths): keyed as /v1 is."""
API_PATHS = ("/v1", *UNVERSIONED)
"""The API's routes: /v1, and vLLM's routes at the root (`_tokenize_routes.py`,
`_scoring_routes.py`)."""
MODELS_PREFIX = "/v1/models/"
ADMIN_ACTIONS = ("load", "unload")
Verdict = Literal["allowed", "unauthorized", "forbidden"]


class KeyFileError(SettingsError):
    """The API key file cannot be read or holds no key."""


class AccessPolicy:
    """The `Access` in force, rebuilt from the settings on `reload` (SIGHUP: a rotated key
    file takes effect without a restart). A file that cannot serve keeps the keys in force."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.current = self._read()

    def reload(self) -> None:
        """Re-read the key file. Raises KeyFileError (the keys in force stay) if it cannot
        serve. Trio thread (a small file: no thread needed)."""
        self.current = self._read()

    def _read(self) -> Access:
        s = self._settings
        return Access.from_settings(
            s.api_key,
            s.api_key_file,
            s.allowed_origins,
            admin_keys=s.admin_key,
            public_metrics=s.public_metrics,
        )


@attrs.frozen
class Access:
    """The server's keys (none: the API is open) and the browser origins it serves."""

    keys: tuple[bytes, ...] = ()
    """Every key that opens the API, the admin keys included."""
    admin_keys: tuple[bytes, ...] = ()
    """Keys that also open the load and unload routes."""
    api_open: bool = True
    """No API key is set (admin keys alone guard only the admin routes)."""
    origins: frozenset[str] = frozenset()
    """Origins whose pages may call the API; "*" is any."""
    keyed_paths: tuple[str, ...] = API_PATHS
    """Path prefixes that need a key (with keys set); not `/metrics` with --public-metrics."""

    @classmethod
    def from_settings(
        cls,
        api_keys: tuple[str, ...],
        key_file: str | None,
        origins: str | None,
        *,
        admin_keys: tuple[str, ...] = (),
        public_metrics: bool = False,
    ) -> Access:
        """Raises KeyFileError for a key file that cannot be read or holds no key."""
        keys = list(api_keys)
        if key_file is not None:
            keys += read_key_file(key_file)
        allowed = frozenset(o.strip() for o in (origins or "").split(",") if o.strip())
        keyed = API_PATHS if public_metrics else (*API_PATHS, "/metrics")
        return cls(
            tuple(k.encode() for k in [*keys, *admin_keys]),
            tuple(k.encode() for k in admin_keys),
            not keys,
            allowed,
            keyed,
        )

    def verdict(self, path: str, authorization: str | None, api_key: str | None = None) -> Verdict:
        """Whether a request to `path` with this Authorization header (`Bearer KEY`) or
        x-api-key header (`api_key`) may proceed: a key missing or wrong is "unauthorized"
        (401), a right key on an admin route that is not an admin key "forbidden" (403).
        Admin keys open every route; admin routes are open only on a server with no key."""
        admin = is_admin_path(path)
        if not admin and (self.api_open or not path.startswith(self.keyed_paths)):
            return "allowed"
        if admin and not self.keys:
            return "allowed"
        candidates = key_candidates(authorization, api_key)
        if admin and any([key_held(c, self.admin_keys) for c in candidates]):
            return "allowed"
        if not any([key_held(c, self.keys) for c in candidates]):  # both, whatever matched
            return "unauthorized"
        return "forbidden" if admin else "allowed"

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """Headers that let a page of `origin` read the response (none: not allowed)."""
        if not origin or not self.origins:
            return {}
        if "*" in self.origins:
            allowed = {"Access-Control-Allow-Origin": "*"}
        elif origin in self.origins:
            allowed = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        else:
            return {}
        return {**allowed, "Access-Control-Expose-Headers": EXPOSED_HEADERS}

    def preflight_headers(self, origin: str | None, requested: str | None) -> dict[str, str]:
        """The answer to a preflight from `origin` that asks for the `requested` headers
        (none: not allowed)."""
        allowed = self.cors_headers(origin)
        if not allowed:
            return {}
        headers = requested or DEFAULT_ALLOWED_HEADERS
        return {
            **allowed,
            "Access-Control-Allow-Methods": ALLOWED_METHODS,
            "Access-Control-Allow-Headers": headers,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE),
        }


def read_key_file(key_file: str) -> list[str]:
    """The keys of a key file: one per line, stripped; blank lines and lines that start with
    `#` are not keys. Raises KeyFileError for a file that cannot be read or holds no key."""
    try:
        lines = Path(key_file).read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the API key file {key_file}: {exc}") from None
    keys = [line.strip() for line in lines]
    keys = [key for key in keys if key and not key.startswith("#")]
    if not keys:
        raise KeyFileError(f"the API key file {key_file} holds no key")
    return keys


ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
"""vLLM's routes that load and unload a LoRA adapter (serving/_adapters.py)."""


def is_admin_path(path: str) -> bool:
    """Whether `path` (decoded, as routed) names an operator's route: a model's load or
    unload, or a LoRA adapter's (`ADMIN_PATHS`, and any spelling of them with a trailing
    slash). Decided on its segments, as the router splits it, whatever characters the
    model's name holds (a newline included); past the prefix, any path whose last segment
    is an action counts, so that no spelling the router takes for one slips by."""
    if path.rstrip("/") in ADMIN_PATHS:
        return True
    if not path.startswith(MODELS_PREFIX):
        return False
    model, sep, action = path[len(MODELS_PREFIX) :].rpartition("/")
    return bool(sep) and action in ADMIN_ACTIONS and bool(model)


def key_candidates(authorization: str | None, api_key: str | None) -> tuple[bytes, bytes]:
    """The keys a request offers: its `Authorization: Bearer KEY` and its `x-api-key`
    (empty where it sends none)."""
    scheme, _, given = (authorization or "").partition(" ")
    bearer = given.strip().encode() if scheme.lower() == "bearer" else b""
    return bearer, (api_key or "").strip().encode()


def key_held(candidate: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether `candidate` is one of `keys`: every key compared in constant time, whatever
    matched, so the time taken says nothing of which key, or how much of one, matched."""
    matched = False
    for key in keys:  # every key, whatever matched: the time says nothing
        matched |= hmac.compare_digest(candidate, key)
    return matched
