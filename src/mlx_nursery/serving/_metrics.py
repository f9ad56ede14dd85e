"""Prometheus metrics (`GET /metrics`) by prometheus-client, named as vLLM names them where
the meaning is the same (`vllm:time_to_first_token_seconds` is ours
`mlx_nursery:time_to_first_token_seconds`), so that dashboards translate by prefix.

Requests are observed where they live: the routes count answers by route and status; a job
records its time to first token, time per output token, end-to-end latency, prompt tokens
and how it ended (`RequestObserver`). What the engine knows (lanes in use, the queue, the
prefix cache, preemptions, the tokens it generated: a cancelled request's included;
speculative decoding's drafts, named as vLLM's `spec_decode` ones) is read from
`Engine.statistics()` at scrape time, not mirrored (the waits for a lane and the preemptions
for a better request by `priority`, a label bounded by `PRIORITY_LIMIT`); an unloaded
model's totals are kept, so its counters go on from them when it loads again. Each server
has its own registry (tests run several in one process), and writes no `*_created` series (a
counter's creation time, which Prometheus does not need and vLLM does not send). No label
carries request content: model, route, status, finish reason, cancel cause, priority and a
reservation's part only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..engine import (
    DiskCacheStats,
    Embedder,
    Engine,
    EngineStatistics,
    WaitStatistics,
    WorkerStats,
    memory_in_cache,
    memory_in_use,
)

PREFIX = "mlx_nursery:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_LOAD_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                  0.75, 1.0, 2.5)  # fmt: skip


class Metrics:
    """One server's metrics; what is per model carries its `model_name` label."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._engines = _EngineCollector()
        self.registry.register(self._engines)
        self.registry.register(_MemoryCollector())

        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(PREFIX + name, text, list(labels), registry=self.registry)

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                PREFIX + name, text, ["model_name"], buckets=buckets, registry=self.registry
            )

        self.requests = counter("http_requests", "HTTP requests answered", "route", "status")
        self.success = counter(
            "request_success",
            "Generations that ended, by finish reason",
            "model_name",
            "finished_reason",
        )
        self.cancelled = counter(
            "request_cancelled", "Requests stopped before their end (generating, embedding)",
            "model_name", "cause",
        )  # fmt: skip
        self.prompt_tokens = counter(
            "prompt_tokens",
            "Prompt tokens of finished generations and embedding requests",
            "model_name",
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "From the request's arrival to its first token",
            _LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "A generation's time per token after its first",
            _TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "From the request's arrival to its generation's end",
            _LATENCY_BUCKETS,
        )

        self.faults_injected = counter(
            "faults_injected", "Requests given an injected fault (--fault-rate)", "kind"
        )
        self.model_loads = counter("model_loads", "Models loaded", "model_name")
        self.model_load_failures = counter(
            "model_load_failures", "Model loads that failed", "model_name"
        )
        self.model_unloads = counter("model_unloads", "Models unloaded", "model_name")
        self.model_load_seconds = histogram(
            "model_load_seconds", "How long a model took to load", _LOAD_BUCKETS
        )
        self.model_loaded_now = Gauge(
            PREFIX + "model_loaded",
            "1 while the model is loaded",
            ["model_name"],
            registry=self.registry,
        )
        self.model_reserved_bytes = Gauge(
            PREFIX + "model_reserved_bytes",
            "Memory a loaded model holds or may hold, by part: its weights, its prefix cache's"
            " budget, the KV its engine may use (no more than its sequences can), its LoRA"
            " adapters",
            ["model_name", "part"],
            registry=self.registry,
        )
        self.connections_open = Gauge(
            PREFIX + "http_connections_open",
            "HTTP connections open (at most --max-connections)",
            registry=self.registry,
        )
        self.refused = counter(
            "http_refused",
            "Connections and requests refused before the app answered them: past"
            " --max-connections, or a body slower than its pace",
            "reason",
        )

    def model_loaded(
        self,
        engine: Engine | Embedder | None,
        model_name: str,
        seconds: float,
        reserved: Mapping[str, int],
    ) -> None:
        """A model loaded: count it, and read its engine's statistics at every scrape (a
        text or embedding engine's; None: a speech model, whose engine has none of those).
        `reserved`: its reservation by part (`Reservation.parts`)."""
        self.model_loads.labels(model_name).inc()
        self.model_load_seconds.labels(model_name).observe(seconds)
        self.model_loaded_now.labels(model_name).set(1)
        for part, size in reserved.items():
            self.model_reserved_bytes.labels(model_name, part).set(size)
        if engine is not None:
            self._engines.engines[model_name] = engine

    def adapters_reserved(self, model_name: str, size: int) -> None:
        """A loaded model's LoRA adapters now reserve `size` bytes (loaded or unloaded at
        runtime: serving/_adapters.py)."""
        self.model_reserved_bytes.labels(model_name, "adapters").set(size)

    def model_unloaded(self, model_name: str) -> None:
        self.model_unloads.labels(model_name).inc()
        self.model_loaded_now.labels(model_name).set(0)
        for part in ("weights", "prefix_cache", "kv", "adapters"):
            self.model_reserved_bytes.labels(model_name, part).set(0)
        self._engines.unloaded(model_name)

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))

    def observer(self, model_name: str, arrived: float) -> RequestObserver:
        return RequestObserver(self, model_name, arrived)


class RequestObserver:
    """What one generation's job reports (times from `trio.current_time()`)."""

    def __init__(self, metrics: Metrics, model_name: str, arrived: float) -> None:
        self._metrics = metrics
        self._model = model_name
        self._arrived = arrived
        self._first: float | None = None

    def first_token(self, now: float) -> None:
        if self._first is None:
            self._first = now
            self._metrics.ttft.labels(self._model).observe(now - self._arrived)

    def finished(self, now: float, reason: str, prompt_tokens: int, tokens: int) -> None:
        """A generation's end; the tokens it generated are the engine's count (a cancelled
        one's too: `_EngineCollector`)."""
        m, model = self._metrics, self._model
        m.success.labels(model, reason).inc()
        m.prompt_tokens.labels(model).inc(prompt_tokens)
        m.e2e.labels(model).observe(now - self._arrived)
        if self._first is not None and tokens > 1:
            m.tpot.labels(model).observe((now - self._first) / (tokens - 1))

    def cancelled(self, cause: str) -> None:
        self._metrics.cancelled.labels(self._model, cause).inc()


_CARRIED: dict[str, tuple[str, Callable[[WorkerStats], int]]] = {
    "generation_tokens": (
        "Tokens generated, by every request that ran (cancelled ones included)",
        lambda worker: worker.generated_tokens,
    ),
    "spec_decode_num_drafts": (
        "Speculative decoding's verify steps (--speculative)",
        lambda worker: worker.verify_steps,
    ),
    "spec_decode_num_draft_tokens": (
        "Tokens drafted by speculative decoding",
        lambda worker: worker.draft_tokens,
    ),
    "spec_decode_num_accepted_tokens": (
        "Drafted tokens accepted and kept",
        lambda worker: worker.accepted_draft_tokens,
    ),
}
"""The engine's counters that go on from an unloaded model's totals when it loads again:
name -> (help, reading)."""


class _EngineCollector(Collector):
    """What each loaded model's engine knows, read at scrape time: one family per metric,
    a sample per model (a family registered twice would be refused by the registry)."""

    def __init__(self) -> None:
        self.engines: dict[str, Engine | Embedder] = {}
        self._before: dict[str, dict[str, int]] = {}
        """A model's counters (`_CARRIED`) from its earlier loads (its engines' last counts)."""

    def unloaded(self, model: str) -> None:
        """`model`'s engine has ended: its totals carry over to its next load."""
        engine = self.engines.pop(model, None)
        if isinstance(engine, Engine):
            self._before[model] = self._totals(model, engine)

    def _totals(self, model: str, engine: Engine | Embedder | None) -> dict[str, int]:
        worker = engine.statistics().worker if isinstance(engine, Engine) else None
        before = self._before.get(model, {})
        return {
            name: before.get(name, 0) + (read(worker) if worker is not None else 0)
            for name, (_, read) in _CARRIED.items()
        }

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

        def sample(kind: str, name: str, text: str, model: str, value: float) -> None:
            family = families.get(name)
            if family is None:
                make = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
                family = families[name] = make(PREFIX + name, text, labels=["model_name"])
            family.add_metric([model], value)

        generating = {m for m, e in self.engines.items() if isinstance(e, Engine)}
        for model in sorted(generating | set(self._before)):
            totals = self._totals(model, self.engines.get(model))
            for name, (text, _) in _CARRIED.items():
                sample("counter", name, text, model, totals[name])
        for model, engine in self.engines.items():
            stats = engine.statistics()
            sample("gauge", "num_requests_running", "Sequences holding a lane", model,
                   stats.lanes_borrowed)  # fmt: skip
            sample("gauge", "num_requests_waiting",
                   "Requests waiting for a lane (those preempted for a better one included)",
                   model, stats.queued + stats.suspended)  # fmt: skip
            sample("gauge", "engine_healthy", "1 while the engine runs", model,
                   float(stats.state == "running"))  # fmt: skip
            worker = stats.worker
            if worker is None:
                continue
            sample("counter", "preemptions", "Sequences preempted for KV memory", model,
                   worker.preemptions)  # fmt: skip
            sample("counter", "held_for_memory", "Requests that waited for KV memory", model,
                   worker.held_for_memory)  # fmt: skip
            cache = worker.prefix_cache
            if cache is not None:
                sample("counter", "prefix_cache_hits", "Prefix cache hits", model, cache.hits)
                sample("counter", "prefix_cache_queries", "Prefix cache lookups", model,
                       cache.hits + cache.misses)  # fmt: skip
                sample("counter", "prefix_cache_hit_tokens", "Prompt tokens reused", model,
                       cache.reused_tokens)  # fmt: skip
                sample("gauge", "prefix_cache_bytes", "Bytes the prefix cache holds", model,
                       cache.nbytes)  # fmt: skip
                sample("counter", "prefix_cache_too_large", "Prefix-cache entries not kept:"
                       " larger than --prompt-cache-bytes", model, cache.too_large)  # fmt: skip
            disk = worker.prefix_disk
            if disk is not None:
                for name, text, value in _disk_counters(disk):
                    sample("counter", name, text, model, value)
                sample("gauge", "prefix_cache_disk_bytes",
                       "Bytes of prefix-cache files in the directory, every model's", model,
                       disk.nbytes)  # fmt: skip
                if disk.read_bytes_per_second is not None:
                    sample("gauge", "prefix_cache_disk_read_bytes_per_second",
                           "The read rate (read, checked, copied into MLX) a read from disk is"
                           " expected to run at", model, disk.read_bytes_per_second)  # fmt: skip
        yield from families.values()
        yield from _by_priority(
            {m: e.statistics() for m, e in self.engines.items() if isinstance(e, Engine)}
        )


def _by_priority(stats: dict[str, EngineStatistics]) -> Iterator[Metric]:
    """The waits for a lane (vLLM's `request_queue_time_seconds`, here by priority too) and
    the preemptions for a better request, by priority, of each text model."""
    labels = ["model_name", "priority"]
    waits = HistogramMetricFamily(
        PREFIX + "request_queue_time_seconds",
        "From a request's arrival at its model's queue to its lane, by priority",
        labels=labels,
    )
    preempted = CounterMetricFamily(
        PREFIX + "priority_preemptions",
        "Requests taken off the device for a better-priority one (their lane or their KV"
        " memory; resumed later), by the priority of the one taken off",
        labels=labels,
    )
    for model, engine in stats.items():
        for priority, wait in engine.queue_waits.items():
            waits.add_metric([model, str(priority)], _buckets(wait), wait.seconds_total)
        counts = engine.worker.priority_preemptions if engine.worker is not None else {}
        for priority, count in sorted(counts.items()):
            preempted.add_metric([model, str(priority)], count)
    yield waits
    yield preempted


def _buckets(wait: WaitStatistics) -> list[tuple[str, float]]:
    """Prometheus' cumulative buckets from per-bucket counts, `+Inf` last."""
    bounds = [*(repr(b) for b in wait.buckets), "+Inf"]
    return list(zip(bounds, itertools.accumulate(wait.counts), strict=True))


def _disk_counters(disk: DiskCacheStats) -> list[tuple[str, str, int]]:
    """The prefix cache's disk tier, as counters."""
    return [
        ("prefix_cache_disk_hits", "Requests started from a prefix read from disk", disk.hits),
        ("prefix_cache_disk_hit_tokens", "Prompt tokens read from disk", disk.hit_tokens),
        ("prefix_cache_disk_writes", "Prefix-cache files written", disk.writes),
        ("prefix_cache_disk_write_failures", "Prefix-cache files that could not be written",
         disk.write_failures),
        ("prefix_cache_disk_writes_dropped", "Prefix-cache files not written: the writer was"
         " behind", disk.dropped),
        ("prefix_cache_disk_rejected_files", "Prefix-cache files refused (damaged, cut short,"
         " another model's) and deleted, never served", disk.rejected),
        ("prefix_cache_disk_evictions", "Prefix-cache files deleted for the byte bound",
         disk.evictions),
        ("prefix_cache_disk_skipped_slower", "Stored prefixes not read from disk: prefilling"
         " them was expected to be faster", disk.skipped_slower),
    ]  # fmt: skip


class _WithoutCreated(Collector):
    """A registry's metrics without their `*_created` samples (prometheus-client writes one
    per counter and histogram child; its switch to stop that is process-wide)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _MemoryCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            PREFIX + "memory_active_bytes",
            "Memory MLX holds in arrays now, every loaded model together",
            value=memory_in_use(),
        )
        yield GaugeMetricFamily(
            PREFIX + "memory_cache_bytes",
            "Freed buffers MLX keeps for reuse, every loaded model together",
            value=memory_in_cache(),
        )
