"""The Quart-Trio application: routes, error envelopes, request ids, and the service's lifetime."""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import Sequence

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from .fault_points import request_label
from .generation import AudioLimits, MediaFetches, OpenAIError
from .http import (
    AccessPolicy,
    LifetimeHTTPConnection,
    RequestLimits,
    ShieldFinalBody,
    body_left_unread,
    current_record,
    envelope_response,
    error_response,
    is_messages_route,
    leave_body_unread,
    request_class_for,
    routes,
    tenant_of,
)
from .serving import (
    BackgroundLimits,
    BackgroundResponses,
    Extension,
    Extensions,
    Generations,
    Metrics,
    ModelOpener,
    Parts,
    Preparation,
    Service,
    WritePolicy,
    image_limits,
    internal_error,
    log_failure,
    model_sources,
)
from .settings import Settings
from .store import responses_store_at

log = logging.getLogger("mlx_nursery.http")

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""A client's request id that is used as given (else one is made): it is echoed and logged,
so a short token that no log reader can take for more than an id (no spaces, no `=`)."""


def asgi_app(app: QuartTrio) -> RequestLimits:
    """`app` as Hypercorn serves it: the URL and header limits first (http/_limits.py), then
    the keep-alive fix and the body writes' fault point (http/_keepalive.py), then the
    extensions' wrappers (serving/_extensions.py)."""
    parts: Parts = app.extensions["mlx_nursery"]
    return RequestLimits(ShieldFinalBody(parts.extensions.wrap(app)))


def create_app(
    settings: Settings | None = None, *, extensions: Sequence[Extension] = ()
) -> QuartTrio:
    """The app. `extensions`: what a test harness adds (serving/_extensions.py; the entry
    points hand it `mlx_nursery.testing.harness`); none is reachable otherwise."""
    settings = settings or Settings.from_env()
    app = QuartTrio("mlx_nursery")
    app.asgi_http_class = LifetimeHTTPConnection  # a request's jobs end with it (_lifetime.py)
    app.request_class = request_class_for(settings.max_audio_bytes)  # the audio routes' limit
    # `/v1//chat/completions` is a 404 in the envelope, not werkzeug's HTML redirect (308).
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes  # 413, see http/_generate.py
    # Receiving the body is paced by --body-timeout and --body-min-rate (http/_body_pace.py),
    # which answer a body too slow with a 408 and close its connection.
    app.config["BODY_TIMEOUT"] = None
    app.config["RESPONSE_TIMEOUT"] = None  # non-streaming responses: bounded by the request timeout
    app.config["PACED_BODY_TIMEOUT"] = settings.body_timeout
    app.config["PACED_BODY_MIN_RATE"] = settings.body_min_rate
    parts = serving_parts(settings, Extensions(tuple(extensions)))
    access = AccessPolicy(settings)
    """API keys and CORS origins in force (reloaded on SIGHUP: server.py)."""
    app.extensions["mlx_nursery"] = parts  # what the routes serve with (http/_generate.py)
    app.extensions["mlx_nursery.access"] = access
    app.register_blueprint(routes)

    @app.before_serving
    async def start_service() -> None:
        app.nursery.start_soon(parts.service.run, app.nursery)

    @app.after_serving
    async def close_store() -> None:
        await parts.store.close()

    @app.before_request
    async def assign_request_id() -> None:
        given = request.headers.get(REQUEST_ID_HEADER, "")
        usable = REQUEST_ID.fullmatch(given) is not None
        g.request_id = given if usable else f"req_{secrets.token_hex(12)}"
        request_label.set(g.request_id)  # inherited by the request's tasks and threads
        record = current_record()
        if record is not None:
            record.request_id = g.request_id

    @app.before_request
    async def check_access() -> Response | None:
        """A browser's preflight is answered here; a /v1 request without a key the server
        holds gets OpenAI's 401 at once, its body unread, an admin route without an admin key
        a 403 (http/_access.py)."""
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            asked = request.headers.get("Access-Control-Request-Headers")
            headers = access.current.preflight_headers(origin, asked)
            return Response("", status=204, headers=headers)
        keys = request.headers.get("Authorization"), request.headers.get("x-api-key")
        verdict = access.current.verdict(request.path, *keys)
        if verdict == "allowed":
            g.tenant = tenant_of(access.current, *keys)  # whose work this is (http/_tenancy.py)
            return None
        if verdict == "forbidden":
            await _drain_body(403)
            return envelope_response(
                403,
                "This route loads and unloads models: it needs an admin key (--admin-key).",
                "invalid_request_error",
                "admin_key_required",
            )
        leave_body_unread()  # a client without a key holds nothing while it sends
        anthropic = is_messages_route(request.path)
        response = envelope_response(
            401,
            "Incorrect or missing API key: send it as 'x-api-key: KEY' or "
            "'Authorization: Bearer KEY'."
            if anthropic
            else "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.",
            "invalid_request_error",
            "invalid_api_key",
            anthropic=anthropic,
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.after_request
    async def return_request_id(response: Response) -> Response:
        response.headers[REQUEST_ID_HEADER] = getattr(g, "request_id", "")
        if is_messages_route(request.path):  # where Anthropic's SDKs read it
            response.headers["request-id"] = getattr(g, "request_id", "")
        response.headers.update(getattr(g, "response_headers", {}))  # http/_generate.note_ignored
        response.headers.update(access.current.cors_headers(request.headers.get("Origin")))
        if body_left_unread() and _body_announced():
            response.headers["Connection"] = "close"  # what is left of it goes unread
        record = current_record()
        if record is not None:
            record.status = response.status_code
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        parts.metrics.requests.labels(rule, str(response.status_code)).inc()
        return response

    @app.errorhandler(OpenAIError)
    async def openai_error(error: OpenAIError) -> Response:
        record = current_record()
        if record is not None:
            record.error = error.code
        if error.status >= 500:
            log.warning("request %s failed: %s", getattr(g, "request_id", "-"), error.message)
        await _drain_body(error.status)
        return error_response(error, anthropic=is_messages_route(request.path))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        code = {
            404: "not_found",
            405: "method_not_allowed",
            413: "request_too_large",
            415: "unsupported_media_type",
        }.get(error.code or 500)
        await _drain_body(error.code or 500)
        return envelope_response(
            error.code or 500,
            error.description or error.name,
            "invalid_request_error",
            code,
            anthropic=is_messages_route(request.path),
        )

    @app.errorhandler(Exception)
    async def unexpected_error(error: Exception) -> Response:
        request_id = getattr(g, "request_id", "-")
        log_failure(request_id, "with an internal error", error)
        await _drain_body(500)
        return error_response(internal_error(request_id), anthropic=is_messages_route(request.path))

    return app


def serving_parts(settings: Settings, extensions: Extensions) -> Parts:
    """The composition root: each part of the serving core built once, and handed what it
    needs."""
    metrics = Metrics()
    store = responses_store_at(settings.responses_db_path(), settings.responses_limits())
    images = image_limits(settings)
    opener = ModelOpener(settings, metrics, images, extensions)
    sources = model_sources(settings)
    writes = WritePolicy(settings.stream_interval)
    background = BackgroundResponses(
        store,
        writes,
        BackgroundLimits(settings.max_background, settings.max_background_per_key),
    )
    service = Service(settings, sources, opener, metrics, store, background, opener.adapters)
    fetches = MediaFetches(settings.max_image_fetches, settings.max_fetched_image_bytes)
    preparation = Preparation(settings.request_timeout, fetches)
    generations = Generations(
        service, preparation, extensions, metrics, fetches_images=bool(images.hosts)
    )
    return Parts(
        service=service,
        preparation=preparation,
        generations=generations,
        metrics=metrics,
        writes=writes,
        store=store,
        background=background,
        audio_limits=AudioLimits(
            max_bytes=settings.max_audio_bytes, max_seconds=settings.max_audio_seconds
        ),
        max_input_items=settings.max_messages,
        extensions=extensions,
    )


async def _drain_body(status: int) -> None:
    """Read what is left of the request body before an error answers it (not past
    --max-request-bytes, and not for a 413 or a request answered without its body:
    `leave_body_unread`): a body left unread makes the server drop the connection, and a
    keep-alive client's next request on it then gets no response at all.
    Cancellation: a checkpoint; a body that stops arriving is bounded by its pace
    (--body-timeout, --body-min-rate)."""
    if status == 413 or body_left_unread():
        return
    with contextlib.suppress(RequestEntityTooLarge, RequestTimeout):
        await request.get_data(cache=False, parse_form_data=False)


def _body_announced() -> bool:
    """Whether the request's head says a body follows."""
    return bool(request.content_length) or "Transfer-Encoding" in request.headers
