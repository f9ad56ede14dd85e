"""The seam between the server and a test harness: what an `Extension` may add to a server.

The serving core, the wire layers and HTTP know a harness (the testing package's: the
scripted model's `script` field, `--fault-rate`, connection drops; a test's extra logits
processors) only through this module. The composition root is handed the extensions to
serve with (`create_app(settings, extensions=...)`); the entry points that serve users
(`mlx-nursery serve`, `mlx_nursery.asgi`, `mlx_nursery.testing.start_server`) hand it
`mlx_nursery.testing.harness(settings)`. Without extensions a server takes no field beyond
its APIs' own, injects nothing and wraps nothing.

What an extension may add, each part optional:

- `fields`: keys of a generation request's body (chat, completions, Responses, Messages)
  taken off it before the API's schema reads it (which refuses a key it does not know), each
  with its parser (on the preparation thread; it raises InvalidRequest naming the key).
- `for_model`: called when a text model opens; its `PlanHook` (None: none) adapts each
  generation request's plan for that model, after the API prepared it, given the fields the
  request sent and its JSON body. A hook may raise the request's error (a 400; an
  `OpenAIError` that answers it before it is queued).
- `on_request`: called as each generation request arrives, before its body is parsed; it
  may raise the error that answers the request at once, or return an `OutputHook` that the
  request's job calls with each output before passing it on (raising there fails the
  generation: its compute stops). A failure that is a `ConnectionDropped` cuts a stream's
  connection instead of ending it with an error event, as a plan's `drop_on_failure` does.
- `wrap`: an ASGI wrapper around the app, inside the server's own (the one that cuts a
  stream's connection where its body yields `http.DROP_CONNECTION` belongs here).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ..generation import Output, Prepared, ServedModel
    from ._metrics import Metrics

FieldParser = Callable[[Any], object]
"""A request field's JSON value -> what a `PlanHook` is given for it. Raises InvalidRequest."""
PlanHook = Callable[["Prepared", Mapping[str, object], Any], "Prepared"]
"""(the plan, the extension fields the request sent, its JSON body) -> the plan to run."""
OutputHook = Callable[["Output"], None]
"""Called with each output of a job before it is passed on; raising fails the generation."""
ASGIApp = Callable[..., Awaitable[None]]
"""An ASGI application: (scope, receive, send)."""


@attrs.frozen
class Extension:
    """What one extension adds (the module's docstring says when each part runs)."""

    name: str
    fields: Mapping[str, FieldParser] = attrs.field(factory=dict)
    for_model: Callable[[ServedModel], PlanHook | None] | None = None
    on_request: Callable[[Metrics], OutputHook | None] | None = None
    wrap: Callable[[ASGIApp], ASGIApp] | None = None


@attrs.frozen
class Extensions:
    """The extensions a server runs with, as its parts consult them."""

    all: tuple[Extension, ...] = ()

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(name for extension in self.all for name in extension.fields)

    def take(self, body: Any) -> tuple[Any, dict[str, Any]]:
        """`body` without the extensions' fields, and those fields as it sent them. Not a
        checkpoint."""
        names = self.fields
        if not names or not isinstance(body, dict) or names.isdisjoint(body):
            return body, {}
        kept = {key: value for key, value in body.items() if key not in names}
        return kept, {key: value for key, value in body.items() if key in names}

    def parse(self, given: Mapping[str, Any]) -> dict[str, object]:
        """The fields `take` found, parsed; raises the first one's InvalidRequest, in the
        extensions' order. Preparation thread."""
        parsed: dict[str, object] = {}
        for extension in self.all:
            for name, parse in extension.fields.items():
                if name in given:
                    parsed[name] = parse(given[name])
        return parsed

    def for_model(self, served: ServedModel) -> tuple[PlanHook, ...]:
        """The plan hooks of a text model that opens, in the extensions' order."""
        hooks = (e.for_model(served) for e in self.all if e.for_model is not None)
        return tuple(hook for hook in hooks if hook is not None)

    def on_request(self, metrics: Metrics) -> OutputHook | None:
        """A generation request arrived: its output hook (None: none). Raises the error that
        answers it at once. Not a checkpoint."""
        hooks = [e.on_request(metrics) for e in self.all if e.on_request is not None]
        found = [hook for hook in hooks if hook is not None]
        if len(found) <= 1:
            return found[0] if found else None

        def each(output: Output) -> None:
            for hook in found:
                hook(output)

        return each

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """`app` inside each extension's ASGI wrapper (the first extension's outermost)."""
        for extension in reversed(self.all):
            if extension.wrap is not None:
                app = extension.wrap(app)
        return app


def planned(
    plan: Prepared, hooks: tuple[PlanHook, ...], fields: Mapping[str, object], body: Any
) -> Prepared:
    """`plan` through a model's hooks, in order. Preparation thread."""
    for hook in hooks:
        plan = hook(plan, fields, body)
    return plan
