"""The prefix cache's disk tier (`--prompt-cache-dir`) across a server restart: what one server
wrote before it shut down, the next server on the same directory reads back, counted on
/metrics and in the usage's cached tokens, with the first run's greedy output.
The tier's rules (longest prefix, tenants, damaged files, the bound) are pinned on the
engine (tests/engine/test_prefix_disk.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
from openai.types import Completion

from tests.http.test_http_metrics import samples, value
from tests.http_helpers import running_server, sdk

PROMPT = [10 + (i * 7) % 1900 for i in range(3 * 256 + 40)]
"""Three of the tier's 256-token blocks and part of a fourth."""


async def test_a_restarted_server_reads_the_prefix_back_from_disk(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Each server ends as SIGTERM ends one (`running_server`: the drain, then the engine's
    close, which waits for its disk writes); nothing but the directory passes between them."""
    directory = str(tmp_path / "kv")
    answers: list[Completion] = []
    metrics: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
    for _ in ("cold", "after a restart"):
        async with (
            running_server(tiny_model, skip_warmup=True, prompt_cache_dir=directory) as server,
            httpx.AsyncClient(base_url=server.base_url) as http,
        ):
            answers.append(
                await sdk(server, max_retries=0).completions.create(
                    model="tiny", prompt=PROMPT, max_tokens=8, temperature=0
                )
            )
            metrics.append(samples((await http.get("/metrics")).text))
    cold, warm = answers
    assert cold.usage is not None and warm.usage is not None
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens == len(PROMPT)
    cold_cached = cold.usage.prompt_tokens_details
    assert cold_cached is None or not cold_cached.cached_tokens
    assert warm.usage.prompt_tokens_details is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached == len(PROMPT) - 1  # all but the last, which the first decode step runs
    tiny = {"model_name": "tiny"}
    hits = [value(m, "mlx_nursery:prefix_cache_disk_hits_total", **tiny) for m in metrics]
    assert hits == [0, 1]
    assert value(metrics[1], "mlx_nursery:prefix_cache_disk_hit_tokens_total", **tiny) == cached
    assert value(metrics[1], "mlx_nursery:prefix_cache_disk_rejected_files_total", **tiny) == 0
    assert warm.choices[0].text == cold.choices[0].text
    assert warm.choices[0].finish_reason == cold.choices[0].finish_reason
    assert warm.usage.completion_tokens == cold.usage.completion_tokens
