"""Token ids without text never crash: a hole in the vocabulary, or an id past the tokenizer
(a checkpoint's embedding rows padded past it), sampled or asked for, stands for no text.

The model is the tiny one with its tokenizer cut back (`helpers.with_textless_ids`): holes,
one id with text after them, then rows past the tokenizer. A forced token script
(`http_helpers.ForcedScript`) and `logit_bias` make the model sample those ids through the
real engine, detokenizer and streams.
"""

from __future__ import annotations

from typing import Any

import httpx
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.engine._detokenizer import TokenTexts
from tests.helpers import TextlessIds, collect
from tests.http_helpers import ForcedScript, chat_body, running_server, sse_events, validate_error


def script(ids: TextlessIds, tokenizer: Any) -> tuple[list[int], str]:
    """Tokens that mix ids with text and ids without (one between the two bytes of "é"),
    and the text they stand for."""
    lead, continuation = tokenizer.convert_tokens_to_ids(["Ã", "©"])  # "é": C3 A9
    tokens = [
        *tokenizer.encode("hello"),
        ids.holes[0],
        ids.padding[0],
        lead,
        ids.holes[-1],
        continuation,
        ids.padding[-1],
        ids.last,
        *tokenizer.encode(" world"),
    ]
    return tokens, f"helloé<filler_{ids.last}> world"


async def test_the_engine_samples_ids_without_text(textless_ids: TextlessIds) -> None:
    config = EngineConfig(textless_ids.path, max_concurrency=2, max_queue=2, warmup=False)
    async with open_engine(config) as engine:
        assert engine.model.vocab_size == textless_ids.rows
        tokenizer = engine.model.tokenizer
        tokens, text = script(textless_ids, tokenizer)
        request = GenerationRequest(
            tokenizer.encode("Say"),
            max_tokens=len(tokens),
            sampling=SamplingParams(temperature=0.0),
            logits_processors=(ForcedScript(tokens, None),),
            logprobs=2,
        )
        run = await collect(engine, request)
    assert run.tokens == tokens
    assert (run.text, run.final.finish_reason, run.final.error) == (text, "length", None)
    token_bytes = engine.model.token_bytes
    assert [token_bytes(t) for t in (*textless_ids.holes, *textless_ids.padding)] == [b""] * 7
    assert token_bytes(textless_ids.last) == f"<filler_{textless_ids.last}>".encode()


def test_detokenizers_give_ids_without_text_nothing(textless_ids: TextlessIds) -> None:
    """Every id the tokenizer lacks (holes, past its last, past the rows) adds no text, also
    while a character is held incomplete; mlx-lm's own map stops short of the last id."""
    tokenizer = load_tokenizer(textless_ids.path)
    texts = TokenTexts(tokenizer)
    tokens, text = script(textless_ids, tokenizer)
    for trim in (True, False):
        detokenizer = texts.detokenizer(trim_space=trim)
        for token in [*tokens, textless_ids.rows + 5]:
            detokenizer.add_token(token)
        detokenizer.finalize()
        assert detokenizer.text == text
    assert len(tokenizer.detokenizer.tokenmap) <= textless_ids.last


async def test_http_serves_ids_without_text_and_refuses_ids_out_of_range(
    textless_ids: TextlessIds,
) -> None:
    """One server. Chat with logprobs, streamed or not: biased to a hole, to a padded row, and
    a forced mix, each ends by its length with the text of the ids that have one; the mix
    through Responses and Messages too. Ids past the model's rows: a 400 naming the id; a
    completions prompt of ids without text below them is served."""
    tokenizer = load_tokenizer(textless_ids.path)
    tokens, text = script(textless_ids, tokenizer)

    def processors(body: Any) -> tuple[Any, ...]:
        user = body.get("user") or (body.get("metadata") or {}).get("user_id")
        return (ForcedScript(tokens, None),) if user == "mixed" else ()

    cases = [
        ({"logit_bias": {str(textless_ids.holes[1]): 100}, "max_tokens": 3}, ""),
        ({"logit_bias": {str(textless_ids.padding[1]): 100}, "max_tokens": 3}, ""),
        ({"user": "mixed", "max_tokens": len(tokens)}, text),
    ]
    async with (
        running_server(textless_ids.path, extra_processors=processors, skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        for stream in (False, True):
            for fields, expected in cases:
                body = chat_body("Hi", temperature=0, logprobs=True, top_logprobs=2, **fields)
                content, finish, entries = await _chat(http, body, stream=stream)
                assert (content, finish) == (expected, "length"), (fields, stream)
                assert len(entries) == fields["max_tokens"]
                assert "".join(e["token"] for e in entries) == content
                assert bytes(b for e in entries for b in e["bytes"]) == content.encode()
        await _other_apis(http, len(tokens), text)
        await _out_of_range(http, textless_ids)


async def _chat(
    http: httpx.AsyncClient, body: dict[str, Any], *, stream: bool
) -> tuple[str, str, list[dict[str, Any]]]:
    """A chat completion's content, finish reason and logprobs entries, streamed or not."""
    if not stream:
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], choice["logprobs"]["content"]
    response = await http.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    chunks = [e for e in await sse_events(response) if e != "[DONE]"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    entries = [e for c in choices for e in (c.get("logprobs") or {}).get("content") or []]
    return content, choices[-1]["finish_reason"], entries


async def _other_apis(http: httpx.AsyncClient, max_tokens: int, text: str) -> None:
    """The forced mix through Responses and Anthropic's Messages: the same text."""
    asked = {"model": "tiny", "temperature": 0}
    responses = await http.post(
        "/v1/responses",
        json={**asked, "input": "Hi", "user": "mixed", "max_output_tokens": max_tokens},
    )
    assert responses.status_code == 200, responses.text
    body = responses.json()
    assert body["status"] == "incomplete"
    assert body["output"][-1]["content"][0]["text"] == text
    messages = await http.post(
        "/v1/messages",
        json={
            **asked,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hi"}],
            "metadata": {"user_id": "mixed"},
        },
    )
    assert messages.status_code == 200, messages.text
    message = messages.json()
    assert (message["content"][0]["text"], message["stop_reason"]) == (text, "max_tokens")


async def _out_of_range(http: httpx.AsyncClient, ids: TextlessIds) -> None:
    rows = ids.rows
    biased = await http.post(
        "/v1/chat/completions", json=chat_body(logit_bias={str(rows): 5}, max_tokens=1)
    )
    prompt = await http.post(
        "/v1/completions", json={"model": "tiny", "prompt": [5, rows, 6], "max_tokens": 1}
    )
    for response, param in ((biased, "logit_bias"), (prompt, "prompt")):
        assert response.status_code == 400, response.text
        error = response.json()
        validate_error(error)
        assert error["error"]["param"] == param
        assert f"token id {rows} " in error["error"]["message"]
    served = await http.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": [5, ids.holes[0], rows - 1],
            "max_tokens": 2,
            "temperature": 0,
            "logprobs": 1,
            "logit_bias": {str(ids.padding[0]): 100},
        },
    )
    assert served.status_code == 200, served.text
    choice = served.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("", "length")
    assert choice["logprobs"]["tokens"] == ["", ""]
    # /detokenize: ids without text stand for none; past the rows, a 400 naming the place.
    alone = await http.post("/detokenize", json={"tokens": [5]})
    holes = await http.post("/detokenize", json={"tokens": [5, ids.holes[0], ids.padding[0]]})
    assert holes.json() == alone.json() and alone.json()["prompt"]
    refused = await http.post("/detokenize", json={"tokens": [5, rows]})
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "tokens[1]")
