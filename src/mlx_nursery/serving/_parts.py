"""What the routes serve with: the parts the composition root (app.py) built, each named."""

from __future__ import annotations

import attrs

from ..generation import AudioLimits
from ..store import ResponsesStorage
from ._background import BackgroundResponses
from ._batching import WritePolicy
from ._extensions import Extensions
from ._generations import Generations
from ._live import LiveRequests
from ._metrics import Metrics
from ._preparation import Preparation
from ._service import Service


@attrs.frozen
class Parts:
    service: Service
    """The served models and the server's state."""
    preparation: Preparation
    """The preparation pool, the image fetches, the request deadline."""
    generations: Generations
    """The generation choreography of the text APIs."""
    metrics: Metrics
    writes: WritePolicy
    """How streams batch their writes; it counts the streams open."""
    store: ResponsesStorage
    """The Responses API's stored responses."""
    background: BackgroundResponses
    """The background responses this process runs."""
    audio_limits: AudioLimits
    max_input_items: int
    """The most items a Responses request's input may hold (`--max-messages`)."""
    extensions: Extensions = attrs.field(factory=Extensions)
    """What a test harness adds (`_extensions.py`); the ASGI wrappers among it wrap the app."""
    live: LiveRequests = attrs.field(factory=LiveRequests)
    """The running requests a client may cancel by id."""
