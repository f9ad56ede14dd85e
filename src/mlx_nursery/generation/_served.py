"""The model as the API presents it: its public name, aliases, and limits."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import InvalidRequest, ModelNotFound, quoted
from ._images import ImageLimits
from ._models import ModelCard, input_modalities
from ._params import RequestCaps

if TYPE_CHECKING:
    from ..engine import Tokenizer, VisionProcessor
    from ._reasoning import ThinkingFormat
    from ._structured import Grammars
    from ._tokenizing import SegmentEncoder
    from ._tools import ToolFormat


@attrs.frozen
class ServedModel:
    name: str
    aliases: frozenset[str]
    """Other names a request may use: the model path or repo id as given to the server."""
    created: int
    tokenizer: Tokenizer
    context_length: int
    vocab_size: int
    """The token ids the model takes (its embedding rows, `engine.ModelInfo.vocab_size`): an id
    at or past it is out of range (a 400); one below it that the tokenizer has no text for
    (a hole, a padded row) is served and stands for no text."""
    tool_format: ToolFormat
    """The model's own tool-call format, or the fallback convention (`_tools.tool_format`)."""
    default_max_tokens: int | None = None
    max_token_bytes: int = 0
    """The most bytes of text one token stands for (`_prompts.longest_token_bytes`), computed
    once; 0 turns the check of a prompt's size before tokenizing off."""
    strict_params: bool = False
    """Refuse the hints this server ignores (`_params.ignored_hints`) with a 400."""
    token_bytes: Callable[[int], bytes] | None = None
    """A token id's exact bytes, for logprobs (`ModelInfo.token_bytes`); None: the UTF-8 of
    its decoded text."""
    grammars: Grammars | None = None
    """Structured outputs for this model's tokenizer (None: unavailable)."""
    thinking: ThinkingFormat | None = None
    """How the model marks its thinking (None: it does not think)."""
    encoder: SegmentEncoder | None = None
    """Encodes rendered prompts piecewise (None: the template tokenizes)."""
    vision: VisionProcessor | None = None
    """A vision-language model's processor (None: the model takes text only)."""
    image_limits: ImageLimits = attrs.field(factory=ImageLimits)
    caps: RequestCaps = attrs.field(factory=RequestCaps)
    """What one request may ask for (messages, tools, max_tokens)."""
    scripted: bool = False
    """The scripted model: no weights; each request's `engine.Script` says its output and
    timing (the testing package's harness makes one from the request)."""
    adapters: Collection[str] = frozenset()
    """The LoRA adapters served on this model, by name, now (a live view: adapters load and
    unload at runtime): a request naming one runs with it."""

    def adapter_for(self, requested: str) -> str | None:
        """The adapter a request for the model `requested` runs with (None: the base)."""
        if requested == self.name or requested in self.aliases:
            return None
        return requested if requested in self.adapters else None

    def with_fetched(self, fetched: Mapping[str, bytes]) -> ServedModel:
        """This model for one request whose remote images were fetched (`_media_fetch`)."""
        if not fetched:
            return self
        return attrs.evolve(self, image_limits=attrs.evolve(self.image_limits, fetched=fetched))

    def room(self, prompt_tokens: int) -> int:
        """The tokens the context leaves for output after a prompt (negative: it does not fit):
        the one context-fit rule every API's plan uses."""
        return self.context_length - prompt_tokens

    @property
    def input_modalities(self) -> list[str]:
        return input_modalities("vlm" if self.vision is not None else "lm")

    def check(self, requested: str) -> None:
        served = requested == self.name or requested in self.aliases
        if not served and requested not in self.adapters:
            raise unknown_model(requested, [self.name, *self.adapters])

    def card(self) -> ModelCard:
        return ModelCard(
            id=self.name,
            created=self.created,
            context_length=self.context_length,
            input_modalities=self.input_modalities,
            kind="vision" if self.vision is not None else "text",
        )


def unknown_model(requested: str, served: Collection[str]) -> ModelNotFound:
    """The 404 for a model this server does not serve, naming those it does."""
    names = ", ".join(f"'{name}'" for name in served)
    return ModelNotFound(
        f"The model {quoted(requested)} does not exist. This server serves: {names}.",
        param="model",
        code="model_not_found",
    )


def requested_model(body: Any) -> str:
    """The `model` a request body names, read before the body is validated in full (a
    server of several models must know which one prepares it). Raises InvalidRequest, in
    the words the full validation would use, for a body that names none."""
    if not isinstance(body, dict):
        raise InvalidRequest("Invalid type for 'body': expected an object", code="invalid_type")
    if "model" not in body:
        raise InvalidRequest(
            "Missing required parameter: 'model'.",
            param="model",
            code="missing_required_parameter",
        )
    model = body["model"]
    if not isinstance(model, str):
        raise InvalidRequest(
            "Invalid type for 'model': expected a string", param="model", code="invalid_type"
        )
    return model
