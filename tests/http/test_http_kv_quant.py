"""`--kv-bits` through a real server: the context length served grows with the tokens the
same KV memory holds, and concurrent requests are answered batched, streamed and not alike."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.http_helpers import engine_of, running_server, sdk

KV_BYTES = 1 << 22
"""The small preset's KV costs 4096 bytes a token in float32, 768 at 4 bits (group size 32)."""


async def _context_length(model: Path, **settings: object) -> int:
    async with running_server(
        model, kv_cache_bytes=KV_BYTES, skip_warmup=True, **settings
    ) as server:
        (card,) = (await sdk(server).models.list()).data
        return int(card.model_extra["context_length"])  # type: ignore[index]


async def test_quantized_kv_serves_a_longer_context_in_the_same_memory(small_model: Path) -> None:
    unquantized = await _context_length(small_model)
    quantized = await _context_length(small_model, kv_bits=4, kv_group_size=32)
    assert unquantized == KV_BYTES // 4096 - 256  # the budget less a step of growth
    assert quantized == KV_BYTES // 768 - 256


async def test_quantized_kv_answers_concurrent_requests_batched(small_model: Path) -> None:
    fields = {"max_tokens": 8, "temperature": 1.0, "seed": 3}
    # With the warm-up, which runs the quantized cache's kernels before the first request.
    async with running_server(small_model, kv_bits=8, kv_group_size=32) as server:
        client = sdk(server)
        texts: dict[tuple[int, bool], str] = {}

        async def ask(i: int, stream: bool) -> None:
            messages = [{"role": "user", "content": f"Question number {i}?" * (i + 1)}]
            if stream:
                chunks = await client.chat.completions.create(
                    model="tiny", messages=messages, stream=True, **fields
                )
                texts[i, stream] = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                full = await client.chat.completions.create(
                    model="tiny", messages=messages, **fields
                )
                texts[i, stream] = full.choices[0].message.content or ""

        async with trio.open_nursery() as nursery:
            for i in range(4):
                for stream in (False, True):
                    nursery.start_soon(ask, i, stream)
        for i in range(4):
            assert texts[i, True] == texts[i, False]
        stats = engine_of(server).statistics().worker
        assert stats is not None and stats.steps < stats.generated_tokens  # rows shared steps
