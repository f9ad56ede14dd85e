"""What a live test server saw (`LiveServer.report`): requests, cancellations, lanes and
jobs, read on the server's Trio thread, where its metrics and engines' statistics live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import attrs

if TYPE_CHECKING:
    from ..serving import Parts

CancelCause = Literal["client", "timeout", "shutdown", "cancel"]
"""Why the server stopped a generation: the client left (a disconnect, a closed stream, an
SDK timeout); its request timeout; the server's shutdown; a cancel by its request id
(`POST /v1/requests/{id}/cancel`)."""


@attrs.frozen
class ServerReport:
    """What the server saw, read at one moment on its Trio thread (counters since start)."""

    requests: Mapping[tuple[str, int], int]
    """Responses by (route, status), e.g. `("/v1/chat/completions", 200)`: the route rule,
    or "unmatched". A request the client abandoned before its answer has none."""
    cancellations: Mapping[str, int]
    """Generations stopped before their end, by cause (`CancelCause`), all models."""
    lanes_in_use: int
    """Sequences holding an engine lane now: 0 once every request has ended."""
    queued: int
    """Requests waiting for a lane now."""
    jobs_running: int
    """Loaded models with a generation still running (its job not yet ended)."""
    generated_tokens: int
    """Tokens the engines produced, all requests."""
    cancels_confirmed: int
    """Cancelled sequences the engines confirmed stopped."""
    steps_past_cancel: int
    """Engine steps run after a cancel beyond the one in flight, summed over cancels: 0 is
    the design bound. A step computes at most one token of a sequence, so 0 means nothing
    was computed for a cancelled request past the step it was in."""
    late_events: int
    """Events for sequences already confirmed stopped: 0 unless the engine has a bug."""

    def requests_to(self, route: str | None = None, status: int | None = None) -> int:
        """Responses to `route` (all routes: None) with `status` (any: None)."""
        return sum(
            count
            for (r, s), count in self.requests.items()
            if (route is None or r == route) and (status is None or s == status)
        )

    def cancelled(self, cause: CancelCause | None = None) -> int:
        """Generations cancelled for `cause` (any cause: None)."""
        if cause is None:
            return sum(self.cancellations.values())
        return self.cancellations.get(cause, 0)

    def leaks(self) -> list[str]:
        """What a finished test should not leave behind, in words (empty: nothing)."""
        found = []
        if self.lanes_in_use:
            found.append(f"{self.lanes_in_use} lane(s) still in use")
        if self.queued:
            found.append(f"{self.queued} request(s) still queued")
        if self.jobs_running:
            found.append(f"{self.jobs_running} model(s) with a generation still running")
        if self.steps_past_cancel:
            found.append(f"{self.steps_past_cancel} engine step(s) past a cancel's step")
        if self.late_events:
            found.append(f"{self.late_events} late engine event(s)")
        return found


def read_report(parts: Parts) -> ServerReport:
    """Everything `ServerReport` holds, read on the server's Trio thread."""
    from ..engine import SpeechEngine, SynthesisEngine

    requests: dict[tuple[str, int], int] = {}
    cancellations: dict[str, int] = {}
    for family in parts.metrics.registry.collect():
        for sample in family.samples:
            if sample.name.endswith("http_requests_total"):
                key = (sample.labels["route"], int(sample.labels["status"]))
                requests[key] = requests.get(key, 0) + int(sample.value)
            elif sample.name.endswith("request_cancelled_total"):
                cause = sample.labels["cause"]
                cancellations[cause] = cancellations.get(cause, 0) + int(sample.value)
    lanes = queued = jobs = tokens = confirmed = past = late = 0
    models = parts.service.models
    for hosted in models.loaded() if models is not None else []:
        if isinstance(hosted.engine, (SpeechEngine, SynthesisEngine)):
            speech = hosted.engine.statistics()
            lanes += speech.lanes_borrowed
            queued += speech.queued
            jobs += hosted.jobs.busy
            continue
        stats = hosted.engine.statistics()  # a text model's engine, or an embedding model's
        lanes += stats.lanes_borrowed
        queued += stats.queued
        jobs += hosted.jobs.busy
        tokens += stats.worker.generated_tokens if stats.worker is not None else 0
        confirmed += stats.cancellations.confirmed
        past += sum(
            max(steps - 1, 0) * count
            for steps, count in enumerate(stats.cancellations.steps_in_flight)
        )
        late += stats.late_events
    return ServerReport(
        requests=requests,
        cancellations=cancellations,
        lanes_in_use=lanes,
        queued=queued,
        jobs_running=jobs,
        generated_tokens=tokens,
        cancels_confirmed=confirmed,
        steps_past_cancel=past,
        late_events=late,
    )
