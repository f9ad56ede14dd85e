"""Raw prompts and token ids: a completion request's prompt, a text tokenized as it is, and
ids checked against the model's rows (what completions, /tokenize and /detokenize take).

An id at or past the model's rows (`ServedModel.vocab_size`), or negative, is a 400 naming
it; an id below them that the tokenizer has no text for (a hole, a padded row) is served
and stands for no text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from .. import fault_points
from ._errors import InvalidRequest
from ._prompts import check_prompt_size
from ._served import ServedModel


def completion_tokens(
    served: ServedModel, prompt: str | list[str] | list[int] | list[list[int]]
) -> list[int]:
    """A completion request's `prompt` as token ids (text tokenized; one prompt only)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise InvalidRequest(
                "one prompt per request is supported (a list of several was given)",
                param="prompt",
                code="unsupported_parameter",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = text_tokens(served, prompt, "prompt")
    else:
        tokens = list(cast("list[int]", prompt))  # a list of ids: the lists are taken above
        check_token_ids(served, tokens, "prompt")
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="prompt", code="invalid_value")
    return tokens


def text_tokens(
    served: ServedModel, text: str, param: str, *, special_tokens: bool = True
) -> list[int]:
    """`text` tokenized as it is, with the tokenizer's special tokens (a BOS, ...) unless
    not `special_tokens`; refused before tokenizing if it could not fit the context."""
    check_prompt_size(served, [text], param)
    fault_points.reach("tokenize")
    return list(served.tokenizer.encode(text, add_special_tokens=special_tokens))


def check_token_ids(
    served: ServedModel, tokens: Sequence[int], param: str, *, indexed: bool = False
) -> None:
    """Refuse (400, naming it) the first id that is not one of the model's rows. The error's
    param is `param`, or with `indexed` the id's place in it (`param[i]`)."""
    vocab_size = served.vocab_size
    for index, token in enumerate(tokens):
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"token id {token} is out of range: this model's token ids are 0..{vocab_size - 1}",
                param=f"{param}[{index}]" if indexed else param,
                code="invalid_value",
            )
