"""API keys and CORS through a real server: the official SDK, httpx, real sockets."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import openai
import pytest
import trio

from mlx_nursery.http._access import Access, is_admin_path
from mlx_nursery.settings import SettingsError
from tests.http_helpers import chat_body, running_server, sdk, spawned_server, validate_error


async def test_a_keyed_server_answers_only_requests_with_one_of_its_keys(
    tiny_model: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("\n  second-key  \n\n# rotated 2024-01\n  #old-key\nthird-key\n")
    async with (
        running_server(tiny_model, api_key="first-key", api_key_file=str(keys)) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        assert (await http.get("/health")).status_code == 200  # open for load balancers
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "first-key"},
            {"Authorization": "Bearer # rotated 2024-01"},  # a comment is not a key
            {"Authorization": "Bearer #old-key"},
            {"Authorization": "Bearer"},  # an empty key is no key
        ):
            refused = await http.post(
                "/v1/chat/completions", json=chat_body(max_tokens=2), headers=headers
            )
            assert refused.status_code == 401, headers
            validate_error(refused.json())
            assert refused.json()["error"]["code"] == "invalid_api_key"
            assert refused.headers["www-authenticate"] == "Bearer"
        listed = await http.get("/v1/models")
        assert listed.status_code == 401
        for key in ("first-key", "second-key", "third-key"):
            reply = await sdk(server, api_key=key).chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
                temperature=0,
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            await sdk(server, api_key="not-one-of-them").models.list()
        # A refused request leaves the connection usable for the next one.
        again = await http.get("/v1/models", headers={"Authorization": "Bearer third-key"})
        assert again.status_code == 200


async def test_browsers_of_allowed_origins_get_cors_headers(tiny_model: Path) -> None:
    page = "https://app.example"
    async with (
        running_server(
            tiny_model, api_key="k", allowed_origins=f"{page}, https://b.example"
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        preflight = await http.options(
            "/v1/chat/completions",
            headers={
                "Origin": page,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204  # answered without a key: browsers send none
        assert preflight.headers["access-control-allow-origin"] == page
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
        stranger = await http.options(
            "/v1/chat/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in stranger.headers
        ok = await http.post(
            "/v1/chat/completions",
            json=chat_body(max_tokens=2),
            headers={"Origin": page, "Authorization": "Bearer k"},
        )
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == page
        exposed = {h.strip() for h in ok.headers["access-control-expose-headers"].split(",")}
        # A page's SDK reads its retry headers as a server's SDK does.
        assert {"x-request-id", "retry-after", "retry-after-ms", "x-should-retry"} <= exposed
        refused = await http.get("/v1/models", headers={"Origin": page})
        assert refused.status_code == 401  # and the page can read why
        assert refused.headers["access-control-allow-origin"] == page
        other = await http.get(
            "/v1/models", headers={"Origin": "https://evil.example", "Authorization": "Bearer k"}
        )
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


async def test_without_keys_or_origins_the_api_is_open_and_sends_no_cors(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = await http.get("/v1/models", headers={"Origin": "https://app.example"})
        assert reply.status_code == 200
        assert "access-control-allow-origin" not in reply.headers


def test_a_key_file_that_cannot_serve_is_a_settings_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n \n")
    with pytest.raises(SettingsError, match="holds no key"):
        Access.from_settings((), str(empty), None)
    with pytest.raises(SettingsError, match="cannot read"):
        Access.from_settings((), str(tmp_path / "missing"), None)
    assert (
        Access.from_settings((), None, "*").cors_headers("https://any.example")[
            "Access-Control-Allow-Origin"
        ]
        == "*"
    )


async def test_sighup_reloads_the_key_file_and_a_bad_file_keeps_the_keys(
    tiny_model: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("old-key\n")
    flags = ("--served-model-name", "tiny", "--api-key-file", str(keys))
    async with (
        spawned_server(tiny_model, *flags) as (process, port),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):

        async def status(key: str) -> int:
            return (
                await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            ).status_code

        def logged(words: str) -> None:
            """Read the server's log until a line with `words` (the signal was handled)."""
            assert process.stderr is not None
            for line in process.stderr:
                if words in line:
                    return
            raise AssertionError(f"the server ended without logging {words!r}")

        assert (await status("old-key"), await status("new-key")) == (200, 401)
        keys.write_text("new-key\n")
        process.send_signal(signal.SIGHUP)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(logged, "API keys reloaded (1)", abandon_on_cancel=True)
        assert (await status("old-key"), await status("new-key")) == (401, 200)
        keys.write_text("\n")  # no key: refused, the keys in force stay
        process.send_signal(signal.SIGHUP)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(
                logged, "the API keys were not reloaded", abandon_on_cancel=True
            )
        assert (await status("old-key"), await status("new-key")) == (401, 200)
        assert (await http.get("/health")).status_code == 200


async def test_metrics_ask_for_a_key_unless_public(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, api_key="k", skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        assert (await http.get("/metrics")).status_code == 401
        keyed = await http.get("/metrics", headers={"Authorization": "Bearer k"})
        assert keyed.status_code == 200 and "mlx_nursery:" in keyed.text
        assert (await http.get("/health")).status_code == 200
    public = Access.from_settings(("k",), None, None, public_metrics=True)
    assert public.verdict("/metrics", None) == "allowed"
    assert public.verdict("/v1/models", None) == "unauthorized"
    assert Access.from_settings((), None, None).verdict("/metrics", None) == "allowed"


async def test_an_admin_route_needs_an_admin_key_however_its_path_is_spelled(
    tiny_model: Path,
) -> None:
    """The admin check reads the path as the router does: a model name holding a newline (or
    an encoded slash) cannot make a load look like another route to a user's key. And a
    model's directory is no name of it: the server does not confirm where its models are."""
    user, root = {"Authorization": "Bearer user"}, {"Authorization": "Bearer root"}
    async with (
        running_server(tiny_model, api_key="user", admin_key="root", skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        for path in (
            "/v1/models/%0atiny/load",
            "/v1/models/tiny%0a/unload",
            "/v1/models/x%2Ftiny/load",
            "/v1/models/tiny/load",
        ):
            refused = await http.post(path, headers=user)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "admin_key_required"
        assert (await http.post("/v1/models/%0atiny/load", headers=root)).status_code == 404
        assert (await http.post("/v1/models/tiny/load", headers=root)).status_code == 200
        directory = str(await trio.Path(tiny_model).resolve())
        for name in (directory, str(tiny_model)):
            card = await http.get(f"/v1/models/{name}", headers=user)
            assert card.status_code == 404
            chat = await http.post(
                "/v1/chat/completions", json=chat_body(model=name, max_tokens=1), headers=user
            )
            assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
        listed = (await http.get("/v1/models", headers=user)).json()
        assert [card["id"] for card in listed["data"]] == ["tiny"]
        assert directory not in json.dumps(listed)


@pytest.mark.parametrize(
    ("path", "admin"),
    [
        ("/v1/models/tiny/load", True),
        ("/v1/models/a/b/unload", True),
        ("/v1/models/\ntiny/load", True),
        ("/v1/models/tiny\n/load", True),
        ("/v1/models/tiny", False),
        ("/v1/models/load", False),  # the card of a model named "load"
        ("/v1/models//load", False),  # no model: not routed
        ("/v1/models/tiny/load/", False),  # the card of "tiny/load/", not the route
        ("/v1/models/tiny/load\n", False),  # not routed (404)
        ("/v1/chat/completions", False),
    ],
)
def test_admin_paths_are_told_by_their_segments(path: str, admin: bool) -> None:
    assert is_admin_path(path) is admin
