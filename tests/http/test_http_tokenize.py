"""/tokenize and /detokenize (vLLM's shapes) over a real server: the chat form counts exactly
the prompt tokens of the same chat request (tools and template options included), the
completion form those of a completions request; special tokens, generation prompt and
continued messages as vLLM has them; ids outside the vocabulary, other kinds of model and
missing keys refused in the envelope."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_nursery.server import Running
from tests.http_helpers import server_thread, validate_error

KEY = "tokenize-key"
BOS = "<|endoftext|>"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def with_bos(tiny: Path, out: Path) -> Path:
    """The tiny model whose tokenizer puts `BOS` before every text it encodes with special
    tokens, as Llama's does (the tiny model's adds none)."""
    shutil.copytree(tiny, out)
    spec = json.loads((out / "tokenizer.json").read_text("utf-8"))
    bos, first, second = (
        {"SpecialToken": {"id": BOS, "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}},
        {"Sequence": {"id": "B", "type_id": 1}},
    )
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, first],
        "pair": [bos, first, second],
        "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}},
    }
    (out / "tokenizer.json").write_text(json.dumps(spec), "utf-8")
    return out


@pytest.fixture(scope="module")
def server(
    tiny_model: Path, tiny_embedding: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    bos = with_bos(tiny_model, tmp_path_factory.mktemp("models") / "bos")
    models = [f"{tiny_model}=tiny", f"{bos}=bos", f"{tiny_embedding}=emb"]
    settings = {
        "max_loaded_models": 2,
        "api_key": (KEY,),
        "skip_warmup": True,
    }  # a token each: no warm-up
    with server_thread(None, model=models, **settings) as served:
        yield served.running


@pytest.fixture
async def http(server: Running) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60) as client:
        yield client


async def _ok(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response


async def _tokenize(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = (await _ok(http, "/tokenize", body)).json()
    assert result["count"] == len(result["tokens"])
    return result


async def _prompt_tokens(http: httpx.AsyncClient, path: str, **body: Any) -> httpx.Response:
    return await _ok(http, path, {"max_tokens": 1, "temperature": 0, **body})


async def _refused(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], status: int = 400
) -> dict[str, Any]:
    response = await http.post(path, json=body)
    assert response.status_code == status, response.text
    validate_error(response.json())
    error: dict[str, Any] = response.json()["error"]
    return error


async def test_the_chat_form_counts_the_prompt_of_the_same_chat_request(
    http: httpx.AsyncClient,
) -> None:
    asked = {"model": "tiny", "messages": MESSAGES, "tools": [WEATHER]}
    options = {**asked, "chat_template_kwargs": {"not_read": 1}}
    chat = await _prompt_tokens(http, "/v1/chat/completions", **options)
    counted = await http.post("/tokenize", json=options)
    assert counted.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    # A variable the template never reads changes nothing; both routes say so.
    assert chat.headers["x-ignored-params"] == "chat_template_kwargs.not_read"
    assert counted.headers["x-ignored-params"] == "chat_template_kwargs.not_read"
    tokenized = await _tokenize(http, **asked)
    assert tokenized["tokens"] == counted.json()["tokens"]
    assert tokenized["token_strs"] is None
    card = (await http.get("/v1/models/tiny")).json()
    assert tokenized["max_model_len"] == card["context_length"]
    without_tools = await _tokenize(http, model="tiny", messages=MESSAGES)
    assert without_tools["count"] < tokenized["count"]  # the tools are in the prompt
    # tool_choice "none" shows the template no tools, in chat and so here; a forced choice
    # is checked as chat checks it.
    hidden = {**asked, "tool_choice": "none"}
    chat_hidden = await _prompt_tokens(http, "/v1/chat/completions", **hidden)
    assert (
        (await _tokenize(http, **hidden))["count"]
        == chat_hidden.json()["usage"]["prompt_tokens"]
        == without_tools["count"]
    )
    named = {"type": "function", "function": {"name": WEATHER["function"]["name"]}}
    assert (await _tokenize(http, **asked, tool_choice=named))["count"] == tokenized["count"]
    unknown = {"type": "function", "function": {"name": "not_a_tool"}}
    assert (await _refused(http, "/tokenize", {**asked, "tool_choice": unknown}))[
        "param"
    ] == "tool_choice"

    # The assistant's opening is the generation prompt; a continued message is left open.
    text = (
        await _ok(http, "/detokenize", {"model": "tiny", "tokens": tokenized["tokens"]})
    ).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n")
    bare = await _tokenize(http, **asked, add_generation_prompt=False)
    assert tokenized["tokens"][: bare["count"]] == bare["tokens"]
    assert bare["count"] < tokenized["count"]
    prefill = [*MESSAGES, {"role": "assistant", "content": "It is"}]
    continued = await _tokenize(
        http, model="tiny", messages=prefill, add_generation_prompt=False,
        continue_final_message=True, return_token_strs=True,
    )  # fmt: skip
    opened = (
        await _ok(http, "/v1/detokenize", {"model": "tiny", "tokens": continued["tokens"]})
    ).json()
    assert opened["prompt"].endswith("<|im_start|>assistant\nIt is")
    assert len(continued["token_strs"]) == continued["count"]
    assert continued["token_strs"][0] == "<|im_start|>"
    both = {**asked, "continue_final_message": True}  # the generation prompt is on by default
    assert (await _refused(http, "/tokenize", both))["param"] == "continue_final_message"


async def test_the_completion_form_and_special_tokens(http: httpx.AsyncClient) -> None:
    prompt = "The quick brown fox"
    plain = await _tokenize(http, model="bos", prompt=prompt, add_special_tokens=False)
    default = await _tokenize(http, model="bos", prompt=prompt)
    assert default["tokens"] == [0, *plain["tokens"]]  # the completion form adds the BOS
    completion = await _prompt_tokens(http, "/v1/completions", model="bos", prompt=prompt)
    assert default["count"] == completion.json()["usage"]["prompt_tokens"]
    text = (await _ok(http, "/v1/detokenize", {"model": "bos", "tokens": default["tokens"]})).json()
    assert text == {"prompt": BOS + prompt}  # special tokens are not skipped

    # The chat form adds none by default: a chat request's template writes what it needs.
    chat = await _tokenize(http, model="bos", messages=MESSAGES)
    asked = await _prompt_tokens(http, "/v1/chat/completions", model="bos", messages=MESSAGES)
    assert chat["count"] == asked.json()["usage"]["prompt_tokens"]
    special = await _tokenize(http, model="bos", messages=MESSAGES, add_special_tokens=True)
    assert special["tokens"] == [0, *chat["tokens"]]


async def test_detokenize_refuses_ids_outside_the_vocabulary(
    server: Running, http: httpx.AsyncClient
) -> None:
    rows = (await _tokenize(http, model="tiny", prompt="x", return_token_strs=True))["tokens"]
    assert rows
    for path in ("/detokenize", "/v1/detokenize"):
        for bad in (2048, -1):  # the tiny model has 2048 rows
            error = await _refused(http, path, {"model": "tiny", "tokens": [1, bad]})
            assert error["param"] == "tokens[1]"
            assert f"token id {bad} is out of range" in error["message"]
    assert (await _ok(http, "/detokenize", {"model": "tiny", "tokens": []})).json() == {
        "prompt": ""
    }


async def test_refusals_in_the_envelope(server: Running, http: httpx.AsyncClient) -> None:
    chat = {"model": "tiny", "messages": MESSAGES}
    for path in ("/tokenize", "/v1/tokenize", "/detokenize"):
        async with httpx.AsyncClient(base_url=server.base_url) as anonymous:
            assert (await anonymous.post(path, json=chat)).status_code == 401
    embedder = await _refused(http, "/tokenize", {"model": "emb", "prompt": "hi"})
    assert embedder["code"] == "model_not_supported"
    unknown = await _refused(http, "/tokenize", {"model": "nope", "prompt": "hi"}, 404)
    assert unknown["code"] == "model_not_found"
    template = await _refused(http, "/tokenize", {**chat, "chat_template": "{{ 7 }}"})
    assert (template["param"], template["code"]) == ("chat_template", "unsupported_parameter")
    for path in ("/tokenize", "/v1/chat/completions"):
        reserved = await _refused(http, path, {**chat, "chat_template_kwargs": {"tools": []}})
        assert reserved["param"] == "chat_template_kwargs.tools"
    unknown_field = await _refused(http, "/tokenize", {**chat, "temperature": 0})
    assert unknown_field["param"] == "temperature"
