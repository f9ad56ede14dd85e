"""/v1/completions: a request validated and tokenized into a `Prepared`, and the completion
objects it renders (`CompletionWire`): one shape for the body and the stream's chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..generation import (
    Finished,
    LogprobEntry,
    Prepared,
    ServedModel,
    ToolCallOut,
    common,
    completion_tokens,
    prepared_for,
    reject_unimplemented,
    require,
    structure,
    to_json,
    with_logprobs,
)
from ._completions import Completion, CompletionChoice, CompletionRequest
from ._usage import UsageOut

_UNIMPLEMENTED: dict[str, object] = {
    "echo": False,
    "suffix": (),
    "best_of": 1,
}


class CompletionWire:
    """Text completion objects: the body, and the chunks of its stream (the same shape)."""

    prompt_param: ClassVar[str] = "prompt"
    id_prefix: ClassVar[str] = "cmpl"
    trims_leading_space: ClassVar[bool] = False

    def body(
        self,
        p: Prepared,
        text: str,
        finished: Finished,
        calls: Sequence[ToolCallOut],
        logprobs: Sequence[LogprobEntry],
        reasoning: str | None,
    ) -> dict[str, Any]:
        choice = CompletionChoice(0, text, finished.reason, _logprobs(p, logprobs, 0))
        body: dict[str, Any] = to_json(
            Completion(p.id, p.created, p.model, [choice], UsageOut.of(finished.usage))
        )
        return body

    def opening_chunks(self, p: Prepared) -> list[dict[str, Any]]:
        return []

    def reasoning_chunk(self, p: Prepared, text: str) -> dict[str, Any]:
        # A completion is the raw continuation of its prompt: nothing is split off as thinking.
        raise AssertionError("completions have no reasoning")

    def delta_chunk(
        self, p: Prepared, text: str, logprobs: Sequence[LogprobEntry], offset: int
    ) -> dict[str, Any]:
        return _chunk(p, text, None, _logprobs(p, logprobs, offset))

    def tool_call_chunks(self, p: Prepared, call: ToolCallOut) -> list[dict[str, Any]]:
        return []  # completions offer no tools

    def closing_chunks(self, p: Prepared, finished: Finished) -> list[dict[str, Any]]:
        chunks = [_chunk(p, "", finished.reason)]
        if p.include_usage:
            usage = UsageOut.of(finished.usage)
            chunks.append(to_json(Completion(p.id, p.created, p.model, [], usage)))
        return chunks


COMPLETION = CompletionWire()


def _chunk(
    p: Prepared, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice = CompletionChoice(0, text, finish_reason, logprobs)
    chunk: dict[str, Any] = to_json(Completion(p.id, p.created, p.model, [choice]))
    if not p.include_usage:
        del chunk["usage"]
    return chunk


def _logprobs(p: Prepared, entries: Sequence[LogprobEntry], offset: int) -> dict[str, Any] | None:
    """Legacy logprobs; `offset` is where the entries start in the content (`text_offset`)."""
    if p.token_text is None:
        return None
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += len(entry.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries],
        "text_offset": offsets,
    }


def prepare_completion(body: Any, served: ServedModel) -> Prepared:
    request = structure(body, CompletionRequest)
    served.check(request.model)
    reject_unimplemented(request, _UNIMPLEMENTED)
    checked = common(request, served)
    tokens = completion_tokens(served, request.prompt)
    prepared = prepared_for(
        COMPLETION, request, served, tokens, request.max_tokens, "max_tokens", checked,
        user_text=lambda: served.tokenizer.decode(tokens),
    )  # fmt: skip
    if request.logprobs is not None:
        require(0 <= request.logprobs <= 5, "logprobs", "logprobs must be between 0 and 5")
    return with_logprobs(prepared, served, request.logprobs)
