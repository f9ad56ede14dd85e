"""A served model's records: its slot (loaded or not), the loaded model (`Hosted`,
`HostedEmbedder`: an embedding model or a cross-encoder), and the one check of a model's
kind against what a route serves.

The kind is checked twice for one request, with one rule: before any load from the
model's config (`ModelSlot.expect`), so that a wrong route never unloads another model,
and on the lease's hosted model (`generating`, `speaking`, `embedding`, `scoring`), for a model
whose config was not read before.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import trio

from ..engine import Embedder, Engine, SpeechEngine, SynthesisEngine
from ..generation import (
    InvalidRequest,
    ModelCard,
    OpenAIError,
    ServedModel,
    card_kind,
    input_modalities,
)
from ..models import ModelFacts
from ..openai import ServedEmbedder
from ._embedding_calls import EmbeddingCalls
from ._extensions import PlanHook
from ._jobs import Jobs
from ._model_sources import ModelSource
from ._reservations import Reservation

SlotState = Literal["unloaded", "loading", "ready", "unloading"]


@attrs.frozen
class Problem:
    """Why a model cannot serve now, as /health reports it."""

    model: str
    component: str
    since: float
    """Wall-clock time (seconds since the epoch) it began."""
    detail: str


@attrs.frozen
class Hosted:
    """A loaded model: its engine, the model as the API presents it, its jobs.

    A speech model (Whisper) runs on a `SpeechEngine` and has no `served` text model: its
    requests are transcriptions (`http/_audio_routes.py`), and the text routes refuse it. A
    speech-synthesis model (KittenTTS, Kokoro) likewise runs on a `SynthesisEngine`: its
    requests are syntheses (`http/_speech_routes.py`)."""

    engine: Engine | SpeechEngine | SynthesisEngine
    served: ServedModel | None
    jobs: Jobs
    reservation: Reservation
    card: ModelCard
    plans: tuple[PlanHook, ...] = ()
    """The extensions' hooks on this model's generation plans (`_extensions.py`)."""

    @property
    def speech(self) -> SpeechEngine | None:
        return self.engine if isinstance(self.engine, SpeechEngine) else None

    @property
    def synthesis(self) -> SynthesisEngine | None:
        return self.engine if isinstance(self.engine, SynthesisEngine) else None

    def text_model(self, name: str) -> ServedModel:
        """The model as the text APIs present it. Raises the 400 for a speech model."""
        if self.served is None:
            raise _wrong_kind(name, "generation", _role(self))
        return self.served


@attrs.frozen
class HostedEmbedder:
    """A loaded embedding model or cross-encoder: its engine, the model as the API presents
    it, the requests computing on it."""

    engine: Embedder
    served: ServedEmbedder
    jobs: EmbeddingCalls
    reservation: Reservation

    @property
    def card(self) -> ModelCard:
        return self.served.card()


AnyHosted = Hosted | HostedEmbedder


ServedKind = Literal["generation", "embedding", "scoring", "speech", "synthesis"]
"""What a route serves: text generation (chat, completions, Responses, Messages), embeddings
(/v1/embeddings), scoring (/v1/rerank, /v1/score), speech (/v1/audio/transcriptions,
/v1/audio/translations), synthesis (/v1/audio/speech)."""

ModelRole = Literal["generation", "embedding", "reranker", "speech", "synthesis"]
"""What a model is, as far as the routes are concerned."""

_SERVES: dict[ModelRole, frozenset[ServedKind]] = {
    "generation": frozenset({"generation"}),
    # cosine similarity of its vectors
    "embedding": frozenset({"embedding", "scoring"}),
    "reranker": frozenset({"scoring"}),
    "speech": frozenset({"speech"}),
    "synthesis": frozenset({"synthesis"}),
}


def role(kind: str) -> ModelRole:
    """What a model of the loader's `kind` is."""
    roles: dict[str, ModelRole] = {
        "embedding": "embedding",
        "reranker": "reranker",
        "stt": "speech",
        "tts": "synthesis",
    }
    return roles.get(kind, "generation")


def _role(hosted: AnyHosted) -> ModelRole:
    if isinstance(hosted, HostedEmbedder):
        return "embedding" if hosted.served.classifier is None else "reranker"
    if hosted.synthesis is not None:
        return "synthesis"
    return "speech" if hosted.speech is not None else "generation"


def _check(name: str, wanted: ServedKind, actual: ModelRole) -> None:
    """The one kind check: raises the 400 when the model `name`, which is an `actual`, does
    not serve `wanted`."""
    if wanted not in _SERVES[actual]:
        raise _wrong_kind(name, wanted, actual)


def generating(hosted: AnyHosted) -> Hosted:
    """`hosted`, a text generation model. Raises the 400 for another kind."""
    _check(hosted.card.id, "generation", _role(hosted))
    assert isinstance(hosted, Hosted)
    return hosted


def speaking(hosted: AnyHosted) -> tuple[Hosted, SpeechEngine]:
    """`hosted`, a speech-to-text model, and its engine. Raises the 400 for another kind."""
    _check(hosted.card.id, "speech", _role(hosted))
    assert isinstance(hosted, Hosted) and hosted.speech is not None
    return hosted, hosted.speech


def synthesizing(hosted: AnyHosted) -> tuple[Hosted, SynthesisEngine]:
    """`hosted`, a speech-synthesis model, and its engine. Raises the 400 for another kind."""
    _check(hosted.card.id, "synthesis", _role(hosted))
    assert isinstance(hosted, Hosted) and hosted.synthesis is not None
    return hosted, hosted.synthesis


def embedding(hosted: AnyHosted) -> HostedEmbedder:
    """`hosted`, an embedding model. Raises the 400 for another kind."""
    _check(hosted.card.id, "embedding", _role(hosted))
    assert isinstance(hosted, HostedEmbedder)
    return hosted


def scoring(hosted: AnyHosted) -> HostedEmbedder:
    """`hosted`, a cross-encoder or an embedding model. Raises the 400 for another kind."""
    _check(hosted.card.id, "scoring", _role(hosted))
    assert isinstance(hosted, HostedEmbedder)
    return hosted


_WHAT: dict[ModelRole, str] = {
    "generation": "a text generation model",
    "embedding": "an embedding model: it serves /v1/embeddings, /v1/rerank and /v1/score",
    "reranker": "a reranker (a cross-encoder): it serves /v1/rerank and /v1/score",
    "speech": (
        "a speech-to-text model: send its requests to /v1/audio/transcriptions or "
        "/v1/audio/translations"
    ),
    "synthesis": "a speech-synthesis (text-to-speech) model: send its requests to /v1/audio/speech",
}
_WHO: dict[ServedKind, str] = {
    "generation": "text generation serves text models (listed in /v1/models with kind text)",
    "embedding": (
        "/v1/embeddings serves embedding models (sentence-transformers checkpoints, BERT-style "
        "encoders)"
    ),
    "scoring": (
        "/v1/rerank and /v1/score serve rerankers (cross-encoders) and embedding models "
        "(listed in /v1/models with kind reranker or embedding)"
    ),
    "speech": (
        "/v1/audio/transcriptions and /v1/audio/translations serve speech models (listed in "
        "/v1/models with kind speech)"
    ),
    "synthesis": (
        "/v1/audio/speech serves text-to-speech models (listed in /v1/models with kind "
        "speech-synthesis)"
    ),
}


def _wrong_kind(name: str, wanted: ServedKind, actual: ModelRole) -> InvalidRequest:
    if actual in ("speech", "synthesis") or wanted == "generation":
        message = f"The model {name!r} is {_WHAT[actual]}."
    else:
        message = f"The model {name!r} is {_WHAT[actual]}; {_WHO[wanted]}."
    return InvalidRequest(message, param="model", code="model_not_supported")


@attrs.define(eq=False)
class Attempt:
    """One load of a model, which every request waiting for the model waits for."""

    done: trio.Event = attrs.Factory(trio.Event)
    failure: OpenAIError | None = None


@attrs.define(eq=False)
class ModelSlot:
    """One served model, loaded or not."""

    source: ModelSource
    state: SlotState = "unloaded"
    hosted: AnyHosted | None = None
    facts: ModelFacts | None = None
    """Read when it first loads (its kind, its own context length)."""
    context: int | None = None
    """The context it serves, known before it loads (`MemoryPlan.served_context`) or since
    it loaded; None: its own, as far as is known."""
    leases: int = 0
    last_used: float = -math.inf
    attempt: Attempt | None = None
    release: trio.Event = attrs.Factory(trio.Event)
    """Set: the hosted model is to be unloaded."""
    ended: trio.Event = attrs.Factory(trio.Event)
    """Set once the hosted model's engine thread has ended (a new one per load)."""
    problem: Problem | None = None
    """Set while the model is down after its engine died (until a restart serves again)."""
    restarts: int = 0

    @property
    def busy(self) -> bool:
        return self.leases > 0 or (self.hosted is not None and self.hosted.jobs.busy)

    def expect(self, wanted: ServedKind) -> ModelSlot:
        """This slot, if its model is known to do what a route wants (unknown until its
        config is read: then the lease's `generating` / `embedding` decides). Raises the
        400 before anything loads, so a wrong route never unloads another model."""
        if self.facts is not None:
            _check(self.source.name, wanted, role(self.facts.kind))
        return self

    def card(self) -> ModelCard:
        if self.hosted is not None and self.state == "ready":
            return self.hosted.card
        facts = self.facts
        kind = facts.kind if facts is not None else "lm"
        return ModelCard(
            id=self.source.name,
            created=0,
            context_length=self.context or (facts.context_length or 0 if facts else 0),
            input_modalities=input_modalities(kind),
            kind=card_kind(kind),
            voices=list(facts.voices) if facts is not None and facts.voices is not None else None,
            loaded=False,
        )
