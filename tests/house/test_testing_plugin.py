"""The pytest plugin (`mlx_nursery.testing.plugin`), run by pytester in inner pytest sessions.

The examples of docs/testing-clients.md are run as written: a sync test, a pytest-trio test
and an anyio test (on asyncio and on Trio) against the fixture's server. The no-leak
assertion is shown able to fail. Inner runs are in-process (the server's imports are paid
once), and set no `trio_mode`: the inner tests say their loop with a marker.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mlx_nursery.testing import start_server

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing-clients.md"


def doc_examples() -> dict[str, str]:
    """The docs' examples by name: each python block after an `<!-- example: NAME -->`."""
    text = DOCS.read_text("utf-8")
    found = re.findall(r"<!-- example: (\w+) -->\n```python\n(.*?)```", text, re.DOTALL)
    return dict(found)


def test_the_docs_have_the_examples() -> None:
    assert set(doc_examples()) == {
        "sdk_timeout",
        "stream_cancelled",
        "retries_429",
        "request_timeout",
    }


def test_the_docs_examples_pass(pytester: pytest.Pytester) -> None:
    """An SDK timeout (sync), a stream the caller cancels (Trio), retries on 429 (anyio:
    asyncio, then Trio), the server's timeout set by the marker: each on its own server."""
    pytester.makepyfile(**{f"test_{name}": code for name, code in doc_examples().items()})
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)  # the anyio test on asyncio and on Trio


def test_a_stream_left_open_fails_the_no_leak_assertion(pytester: pytest.Pytester) -> None:
    """The code under test reads one chunk and keeps the stream: the lane is in use, and
    `assert_no_leaks` says so; the server's shutdown after the test still ends cleanly."""
    pytester.makepyfile(
        """
        def test_leaves_a_stream_open(mlx_server):
            stream = mlx_server.client().chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_body={"script": {"output": {"chunks": ["a", "b"]},
                                       "stalls": [{"at": 1, "seconds": 30}]}},
            )
            next(iter(stream))
            assert mlx_server.lanes_in_use() == 1
            mlx_server.assert_no_leaks(within=0.2)
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*the server still holds: 1 lane(s) still in use; 1 model(s) with a generation*"]
    )


def test_the_session_server_is_shared_and_configured_by_its_fixture(
    pytester: pytest.Pytester,
) -> None:
    """One server for every test of the session, with the settings its fixture gives; a
    test's marker configures `mlx_server` alone."""
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(scope="session")
        def mlx_session_server_settings():
            return {"max_concurrency": 3}

        URLS = []
        """
    )
    pytester.makepyfile(
        """
        import pytest
        from conftest import URLS

        @pytest.mark.parametrize("turn", [1, 2])
        def test_shared(mlx_session_server, turn):
            URLS.append(mlx_session_server.base_url)
            assert len(set(URLS)) == 1
            reply = mlx_session_server.client().completions.create(
                model="scripted", prompt="x", extra_body={"script": {"output": {"text": "ok"}}}
            )
            assert reply.choices[0].text == "ok"
            report = mlx_session_server.assert_no_leaks()
            assert report.requests_to("/v1/completions", 200) == turn
            assert mlx_session_server.report().lanes_in_use == 0

        @pytest.mark.mlx_server("scripted", max_concurrency=1)
        def test_marker(mlx_server):
            assert mlx_server.base_url not in URLS
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_plugin_imports_nothing_heavy_at_startup() -> None:
    """A test run that never uses the fixtures pays for neither the server nor its models."""
    code = (
        "import sys, mlx_nursery.testing.plugin\n"
        "heavy = ['trio', 'openai', 'quart', 'mlx', 'mlx_nursery.server',"
        " 'mlx_nursery.testing._live']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_real_model_directory_is_served(tiny_model: Path) -> None:
    """Not only the scripted model: a model directory, named as the settings say; reads
    from a sync test, and the report kept after the server stopped."""
    with start_server(str(tiny_model), served_model_name="tiny", max_concurrency=2) as server:
        assert server.model == "tiny"
        reply = server.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.usage is not None and reply.usage.completion_tokens <= 3
        report = server.assert_no_leaks()
        assert report.requests_to("/v1/chat/completions") == 1
        assert report.generated_tokens == reply.usage.completion_tokens
    assert server.report().requests_to(status=200) == 1


def test_a_server_that_cannot_start_raises_and_leaves_no_thread(tmp_path: Path) -> None:
    threads = {t.name for t in threading.enumerate()}
    missing = str(tmp_path / "no")
    with pytest.raises(RuntimeError, match="model failed to load"), start_server(missing):
        pass
    assert {t.name for t in threading.enumerate()} <= threads
