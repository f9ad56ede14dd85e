"""Images in chat over HTTP, with the tiny random-weight Qwen2-VL model: the official SDK,
httpx, a real Hypercorn server. Images reach the model; every image the server cannot or
may not take is a 400 in OpenAI's envelope naming the part; the server serves on."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    running_server,
    sdk,
    server_thread,
    sse_events,
    validate_error,
)


def png(seed: int, size: tuple[int, int] = (80, 64), *, mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_chat(*urls: str, text: str = "What is in the picture?", **fields: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url, "detail": "auto"}} for url in urls
    ]
    parts.append({"type": "text", "text": text})
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 8,
        "temperature": 0,
        **fields,
    }


@pytest.fixture(scope="module")
def vlm(tiny_vlm: Path) -> Iterator[ThreadedServer]:
    """The tiny VLM served with the default settings, for the tests that need no others."""
    with server_thread(tiny_vlm) as served:
        yield served


@pytest.fixture(scope="module")
def small_images_only(tiny_vlm: Path) -> Iterator[ThreadedServer]:
    with server_thread(tiny_vlm, max_image_pixels=250 * 250) as served:
        yield served


async def test_images_reach_the_model_through_the_sdk(vlm: ThreadedServer) -> None:
    async with borrowed(vlm) as server:
        client = sdk(server)
        listed = (await client.models.list()).data[0]
        assert listed.model_extra is not None
        assert listed.model_extra["input_modalities"] == ["text", "image"]

        async def answer(*urls: str) -> str:
            reply = await client.chat.completions.create(**image_chat(*urls))
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage is not None and reply.usage.completion_tokens == 8
            return reply.choices[0].message.content or ""

        first = await answer(data_url(png(1)))
        assert await answer(data_url(png(2))) != first
        assert await answer(data_url(png(1))) == first
        # JPEG, WebP and a GIF's first frame decode too; two images in one message count.
        for media, fmt in (("image/jpeg", "JPEG"), ("image/webp", "WEBP"), ("image/gif", "GIF")):
            out = io.BytesIO()
            Image.open(io.BytesIO(png(3))).save(out, format=fmt)
            assert await answer(data_url(out.getvalue(), media))
        assert await answer(data_url(png(1)), data_url(png(2))) != await answer(
            data_url(png(2)), data_url(png(1))
        )

        stream = await client.chat.completions.create(**image_chat(data_url(png(1))), stream=True)
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert streamed == first


async def test_an_image_in_an_earlier_turn_still_counts(vlm: ThreadedServer) -> None:
    def conversation(seed: int) -> dict[str, Any]:
        body = image_chat(data_url(png(seed)))
        body["messages"] += [
            {"role": "assistant", "content": "A picture."},
            {"role": "user", "content": "Say more."},
        ]
        return body

    async with (
        borrowed(vlm) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        replies = [(await http.post("/v1/chat/completions", json=conversation(s))) for s in (1, 2)]
        assert [r.status_code for r in replies] == [200, 200]
        texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
        assert texts[0] != texts[1]
        # /tokenize renders it as chat does: the image's tokens are in its count.
        asked = {k: v for k, v in conversation(1).items() if k in ("model", "messages")}
        counted = await http.post("/tokenize", json=asked)
        assert counted.json()["count"] == replies[0].json()["usage"]["prompt_tokens"]
        special = await http.post("/tokenize", json={**asked, "add_special_tokens": True})
        assert (
            special.status_code == 400 and special.json()["error"]["param"] == "add_special_tokens"
        )


@pytest.mark.parametrize(
    ("url", "code", "param"),
    [
        ("data:image/png;base64,!!!not-base64", "invalid_image", "image_url.url"),
        (data_url(b"these bytes are no image"), "invalid_image", "image_url.url"),
        (data_url(png(1), "text/plain"), "invalid_image", "image_url.url"),
        ("data:image/png,raw", "invalid_image", "image_url.url"),
        ("https://example.com/cat.png", "invalid_image", "image_url.url"),
        ("file:///etc/hostname", "invalid_image", "image_url.url"),
        ("ftp://example.com/cat.png", "invalid_image", "image_url.url"),
        (data_url(png(1, (300, 300))), "image_too_large", "image_url.url"),
        (data_url(png(1, (1000, 2))), "invalid_image", ""),  # the processor's own limits
        (data_url(png(1, (30, 30))), None, None),  # the control: a small image is taken
    ],
)
async def test_images_the_server_cannot_take_are_400s_naming_the_part(
    small_images_only: ThreadedServer, url: str, code: str | None, param: str | None
) -> None:
    async with (
        borrowed(small_images_only) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = await http.post("/v1/chat/completions", json=image_chat(data_url(png(5)), url))
        if code is None:
            assert reply.status_code == 200
            return
        assert reply.status_code == 400, reply.text
        validate_error(reply.json())
        error = reply.json()["error"]
        part = "messages[0].content[1]"
        assert (error["code"], error["param"]) == (code, f"{part}.{param}" if param else part)
        assert (await http.get("/health")).status_code == 200
        ok = await http.post("/v1/chat/completions", json=image_chat(data_url(png(5))))
        assert ok.status_code == 200


async def test_limits_on_bytes_and_count_and_local_files(tiny_vlm: Path, tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "one.png").write_bytes(png(1))
    (tmp_path / "outside.png").write_bytes(png(1))
    small = png(1, (20, 20))
    async with (
        running_server(
            tiny_vlm,
            max_image_bytes=len(small) + 10,
            max_images_per_request=2,
            allowed_local_media_path=str(allowed),
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        big = await http.post("/v1/chat/completions", json=image_chat(data_url(png(1))))
        assert big.status_code == 400 and big.json()["error"]["code"] == "image_too_large"
        three = await http.post("/v1/chat/completions", json=image_chat(*[data_url(small)] * 3))
        assert three.status_code == 400
        assert three.json()["error"]["code"] == "image_too_large"
        assert three.json()["error"]["param"] == "messages[0].content[2]"
        for escape in (f"file://{tmp_path}/outside.png", f"file://{allowed}/../outside.png"):
            refused = await http.post("/v1/chat/completions", json=image_chat(escape))
            assert refused.status_code == 400, escape
            assert refused.json()["error"]["code"] == "invalid_image"
        # A file inside the directory, over the byte limit: refused by size, not by place.
        local = await http.post(
            "/v1/chat/completions", json=image_chat(f"file://{allowed}/one.png")
        )
        assert local.json()["error"]["code"] == "image_too_large"
        (allowed / "small.png").write_bytes(small)
        fine = await http.post(
            "/v1/chat/completions", json=image_chat(f"file://{allowed}/small.png")
        )
        assert fine.status_code == 200
        inline = await http.post("/v1/chat/completions", json=image_chat(data_url(small)))
        assert inline.json()["choices"][0]["message"] == fine.json()["choices"][0]["message"]


async def test_a_text_model_refuses_images_by_name(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        listed = (await http.get("/v1/models")).json()["data"][0]
        assert listed["input_modalities"] == ["text"]
        reply = await http.post("/v1/chat/completions", json=image_chat(data_url(png(1))))
        assert reply.status_code == 400
        validate_error(reply.json())
        error = reply.json()["error"]
        assert "does not take images" in error["message"]
        assert error["param"] == "messages[0].content[0].type"


async def test_a_streamed_image_request_ends_like_any_other(vlm: ThreadedServer) -> None:
    async with (
        borrowed(vlm) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = image_chat(data_url(png(1)), stream=True, stream_options={"include_usage": True})
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = await sse_events(response)
        assert events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 8
        assert events[-2]["usage"]["prompt_tokens"] > 16  # the image's tokens count


async def test_structured_output_logprobs_and_stop_strings_work_with_images(
    vlm: ThreadedServer,
) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    async with borrowed(vlm) as server:
        client = sdk(server)
        constrained = await client.chat.completions.create(
            **image_chat(data_url(png(1)), max_tokens=40),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": schema, "strict": True},
            },
        )
        content = constrained.choices[0].message.content
        assert content is not None and json.loads(content)["colour"] in ("red", "blue")

        scored = await client.chat.completions.create(
            **image_chat(data_url(png(1))), logprobs=True, top_logprobs=2
        )
        entries = scored.choices[0].logprobs
        assert entries is not None and entries.content is not None
        assert len(entries.content) == 8
        assert all(len(e.top_logprobs) == 2 for e in entries.content)

        plain = scored.choices[0].message.content or ""
        assert len(plain) > 2
        stop = plain[1:3]
        stopped = await client.chat.completions.create(**image_chat(data_url(png(1))), stop=[stop])
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].message.content == plain[: plain.index(stop)]


def responses_input(url: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": url, "detail": "auto"},
                {"type": "input_text", "text": text},
            ],
        }
    ]


async def test_responses_take_images_as_chat_does(vlm: ThreadedServer) -> None:
    async with (
        borrowed(vlm) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        client = sdk(server)

        async def respond(url: str, **fields: Any) -> Any:
            return await client.responses.create(
                model="tiny",
                input=responses_input(url),  # type: ignore[arg-type]
                max_output_tokens=8,
                temperature=0,
                **fields,
            )

        first, second = await respond(data_url(png(1))), await respond(data_url(png(2)))
        assert first.output_text != second.output_text
        chat = await client.chat.completions.create(**image_chat(data_url(png(1))))
        assert first.output_text == chat.choices[0].message.content  # the same prompt

        # A later turn still sees the first turn's image.
        follow_ups = [
            await client.responses.create(
                model="tiny",
                previous_response_id=r.id,
                input="Say more.",
                max_output_tokens=8,
                temperature=0,
            )
            for r in (first, second)
        ]
        assert follow_ups[0].output_text != follow_ups[1].output_text
        items = (await http.get(f"/v1/responses/{first.id}/input_items")).json()["data"]
        image = items[0]["content"][0]
        assert (image["type"], image["image_url"]) == ("input_image", data_url(png(1)))

        by_file = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Look."},
                            {"type": "input_image", "file_id": "file-123"},
                        ],
                    }
                ],
            },
        )
        assert by_file.status_code == 400
        validate_error(by_file.json())
        assert by_file.json()["error"]["param"] == "input[0].content[1].file_id"

        broken = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "Hello."},
                    {"role": "assistant", "content": "Hi."},
                    *responses_input(data_url(b"no image at all")),
                ],
            },
        )
        assert broken.status_code == 400
        error = broken.json()["error"]
        assert (error["code"], error["param"]) == (
            "invalid_image",
            "input[2].content[0].image_url",
        )


async def test_a_part_neither_text_nor_image_is_named_beside_an_image(
    vlm: ThreadedServer,
) -> None:
    body = image_chat(data_url(png(1)))
    body["messages"][0]["content"].append({"type": "input_audio", "input_audio": {}})
    async with (
        borrowed(vlm) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 400
        validate_error(reply.json())
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == (
            "unsupported_content",
            "messages[0].content[2].type",
        )


async def test_image_detail_is_a_hint_named_as_ignored_or_refused_when_strict(
    vlm: ThreadedServer, tiny_vlm: Path
) -> None:
    """`detail` (chat's `image_url.detail`, Responses' `input_image.detail`): the model's
    processor decides the resolution, so "low"/"high" are named in x-ignored-params, and
    with --strict-params refused; "auto" is no hint."""

    def chat(detail: str) -> dict[str, Any]:
        body = image_chat(data_url(png(1)))
        body["messages"][0]["content"][0]["image_url"]["detail"] = detail
        return body

    def respond(detail: str) -> dict[str, Any]:
        parts = responses_input(data_url(png(1)))
        parts[0]["content"][0]["detail"] = detail
        return {"model": "tiny", "input": parts, "max_output_tokens": 4}

    for strict in (False, True):
        async with (
            running_server(tiny_vlm, strict_params=True) if strict else borrowed(vlm) as server,
            httpx.AsyncClient(base_url=server.base_url) as http,
        ):
            for path, make, name in (
                ("/v1/chat/completions", chat, "image_url.detail"),
                ("/v1/responses", respond, "input_image.detail"),
            ):
                auto = await http.post(path, json=make("auto"))
                assert auto.status_code == 200
                assert name not in auto.headers.get("x-ignored-params", "")
                high = await http.post(path, json=make("high"))
                if strict:
                    assert high.status_code == 400
                    validate_error(high.json())
                    assert high.json()["error"]["param"] == name
                else:
                    assert high.status_code == 200
                    assert name in high.headers["x-ignored-params"]
