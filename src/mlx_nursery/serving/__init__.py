"""The serving core, apart from HTTP: what a request is served with once its route has read it.

The model registry (loading, leasing, the memory plan, engine restarts), jobs (a generation
tied to its request, drained at shutdown), background responses (a generation apart from
its request, stored as it goes), embedding calls, the models a server offers,
the seam a test harness plugs into (`Extension`, `_extensions.py`), metrics, request-log
records, how streams batch their writes, the preparation pool, the running requests a
client may cancel by id, and the one generation choreography every text API plugs into. It
imports no Quart, Werkzeug or Hypercorn (tests/house/test_house_rules.py pins it): the HTTP
layer (`http/`) reads requests and writes responses around it.
"""

from ._adapters import LoraAdapters
from ._background import BackgroundLaunch, BackgroundLimits, BackgroundResponses
from ._batching import WriteBatcher, WritePolicy, merged_text
from ._embedding_calls import EmbeddingCalls
from ._extensions import ASGIApp, Extension, Extensions, OutputHook, PlanHook
from ._failures import internal_error, log_failure
from ._generations import Caller, Detach, Generations, JobStarter, Recipe
from ._job import Job, JobItem
from ._jobs import Jobs
from ._live import LiveRequest, LiveRequests
from ._metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ._metrics import Metrics
from ._model_sources import ModelSource, model_sources
from ._opening import ModelOpener, image_limits
from ._parts import Parts
from ._preparation import PREPARE_THREADS, Preparation
from ._rendering import (
    BodyRenderer,
    PieceRenderer,
    RenderedStream,
    StreamRenderer,
    collect,
    ended_early,
    render_piece,
)
from ._request_log import RequestRecord
from ._service import Service
from ._slots import embedding, scoring, speaking, synthesizing
from ._tenant import ANONYMOUS, Tenant

__all__ = [
    "ANONYMOUS",
    "METRICS_CONTENT_TYPE",
    "PREPARE_THREADS",
    "ASGIApp",
    "BackgroundLaunch",
    "BackgroundLimits",
    "BackgroundResponses",
    "BodyRenderer",
    "Caller",
    "Detach",
    "EmbeddingCalls",
    "Extension",
    "Extensions",
    "Generations",
    "Job",
    "JobItem",
    "JobStarter",
    "Jobs",
    "LiveRequest",
    "LiveRequests",
    "LoraAdapters",
    "Metrics",
    "ModelOpener",
    "ModelSource",
    "OutputHook",
    "Parts",
    "PieceRenderer",
    "PlanHook",
    "Preparation",
    "Recipe",
    "RenderedStream",
    "RequestRecord",
    "Service",
    "StreamRenderer",
    "Tenant",
    "WriteBatcher",
    "WritePolicy",
    "collect",
    "embedding",
    "ended_early",
    "image_limits",
    "internal_error",
    "log_failure",
    "merged_text",
    "model_sources",
    "render_piece",
    "scoring",
    "speaking",
    "synthesizing",
]
