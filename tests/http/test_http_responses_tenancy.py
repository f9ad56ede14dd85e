"""Stored responses belong to the API key that made them, through a real server: another key
gets the 404 of an id that never existed for every route that reaches a stored response; an
admin key reaches them all; a key past its quota evicts only its own; the store's byte
budget evicts the oldest, whoever stored it; an image is stored once; a database from
before owners is upgraded in place."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from tests.http.test_http_vision import data_url, png, responses_input
from tests.http_helpers import running_server, validate_error

KEYS = {"a": "key-a", "b": "key-b", "admin": "root-key"}
MISSING = "resp_" + "0" * 24
"""An id that never existed: what another key's response must look like."""


def _clients(base_url: str) -> dict[str, httpx.AsyncClient]:
    return {
        name: httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )
        for name, key in KEYS.items()
    }


def _create(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_output_tokens": 2, "temperature": 0, **fields}


async def _reach(http: httpx.AsyncClient, response_id: str) -> list[httpx.Response]:
    """Every route that reaches a stored response: retrieve, input items, continue, delete
    (last: it erases what the others read)."""
    return [
        await http.get(f"/v1/responses/{response_id}"),
        await http.get(f"/v1/responses/{response_id}/input_items"),
        await http.post(
            "/v1/responses", json=_create(input="More.", previous_response_id=response_id)
        ),
        await http.delete(f"/v1/responses/{response_id}"),
    ]


def _as_missing(answer: httpx.Response, response_id: str) -> Any:
    """`answer`'s status and body with the id asked for put as `MISSING`."""
    return answer.status_code, json.loads(answer.text.replace(response_id, MISSING))


async def _assert_not_found_as_if_missing(http: httpx.AsyncClient, response_id: str) -> None:
    answers = await _reach(http, response_id)
    for answer in answers:
        assert answer.status_code == 404, answer.text
        validate_error(answer.json())
    missing = [_as_missing(answer, MISSING) for answer in await _reach(http, MISSING)]
    assert [_as_missing(answer, response_id) for answer in answers] == missing
    assert missing[2][1]["error"]["param"] == "previous_response_id"
    assert {body["error"]["code"] for _, body in missing} == {"response_not_found"}


async def test_another_key_cannot_reach_a_response_and_an_admin_key_can(
    tiny_model: Path,
) -> None:
    async with running_server(
        tiny_model,
        api_key=(KEYS["a"], KEYS["b"]),
        admin_key=(KEYS["admin"],),
        responses_max_per_key=3,
    ) as server:
        clients = _clients(server.base_url)
        a, b, admin = clients["a"], clients["b"], clients["admin"]
        try:
            created = (await a.post("/v1/responses", json=_create(input="Hi."))).json()
            streamed = await a.post("/v1/responses", json=_create(input="Hi.", stream=True))
            events = [
                json.loads(line[6:])
                for line in streamed.text.splitlines()
                if line.startswith("data: ")
            ]
            assert events[-1]["type"] in ("response.completed", "response.incomplete")
            stream_id = events[-1]["response"]["id"]
            for response_id in (created["id"], stream_id):  # both stored as key a's
                await _assert_not_found_as_if_missing(b, response_id)
                assert (await a.get(f"/v1/responses/{response_id}")).status_code == 200
            # Its owner reaches it (b's tries erased nothing), and so does an admin key.
            retrieved = await a.get(f"/v1/responses/{created['id']}")
            assert retrieved.json() == created
            follow = await a.post(
                "/v1/responses", json=_create(input="More.", previous_response_id=created["id"])
            )
            assert follow.json()["previous_response_id"] == created["id"]
            for answer in await _reach(admin, created["id"]):  # the last one deletes it
                assert answer.status_code == 200, answer.text
            assert (await a.get(f"/v1/responses/{created['id']}")).status_code == 404

            # b fills its quota of 3: b's oldest goes, never a's.
            b_ids = [
                (await b.post("/v1/responses", json=_create(input=f"n{n}"))).json()["id"]
                for n in range(4)
            ]
            kept = [(await b.get(f"/v1/responses/{i}")).status_code for i in b_ids]
            assert kept == [404, 200, 200, 200]
            for response_id in (stream_id, follow.json()["id"]):
                assert (await a.get(f"/v1/responses/{response_id}")).status_code == 200
        finally:
            for client in clients.values():
                await client.aclose()


def _old_database(path: Path) -> str:
    """A store file as an earlier version made it (no owners), holding one response."""
    body = {"id": "resp_old", "object": "response", "status": "completed", "output": []}
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, created_at REAL NOT NULL,"
            " body TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO responses VALUES (?, ?, ?, '[]', '[]')",
            ("resp_old", time.time() - 60, json.dumps(body)),
        )
    return "resp_old"


def _sizes(path: Path) -> tuple[int, int]:
    """Bytes the store file's rows and large strings hold, and how many strings."""
    with sqlite3.connect(path) as db:
        ((documents,),) = db.execute("SELECT SUM(bytes) FROM responses").fetchall()
        ((strings, count),) = db.execute(
            "SELECT COALESCE(SUM(length(value)), 0), COUNT(*) FROM response_blobs"
        ).fetchall()
    return int(documents) + int(strings), int(count)


async def test_an_image_is_stored_once_and_the_byte_budget_evicts_the_oldest(
    tiny_vlm: Path, tmp_path: Path
) -> None:
    first_image, second_image = data_url(png(1, (400, 400))), data_url(png(2, (400, 400)))
    database = tmp_path / "responses.db"
    old = _old_database(database)
    async with running_server(
        tiny_vlm,
        api_key=(KEYS["a"], KEYS["b"]),
        admin_key=(KEYS["admin"],),
        responses_db=str(database),
        responses_max_bytes=len(first_image) * 3 // 2,
    ) as server:
        clients = _clients(server.base_url)
        a, b, admin = clients["a"], clients["b"], clients["admin"]
        try:
            # The upgraded database's response has no owner: an admin key's to reach.
            assert (await a.get(f"/v1/responses/{old}")).status_code == 404
            assert (await admin.get(f"/v1/responses/{old}")).status_code == 200
            assert (await admin.delete(f"/v1/responses/{old}")).status_code == 200

            first = await a.post("/v1/responses", json=_create(input=responses_input(first_image)))
            assert first.status_code == 200, first.text
            stored, strings = _sizes(database)
            assert strings == 1 and len(first_image) < stored < len(first_image) + 4_000
            items = (await a.get(f"/v1/responses/{first.json()['id']}/input_items")).json()
            assert items["data"][0]["content"][0]["image_url"] == first_image
            # A follow-up replays the image: the same stored string, counted once.
            follow = await a.post(
                "/v1/responses",
                json=_create(input="More.", previous_response_id=first.json()["id"]),
            )
            assert follow.status_code == 200, follow.text
            assert _sizes(database)[1] == 1
            assert _sizes(database)[0] < len(first_image) + 8_000

            # Another key's image puts the store past its budget: the oldest responses go,
            # whoever stored them, until it fits.
            second = await b.post(
                "/v1/responses", json=_create(input=responses_input(second_image))
            )
            assert second.status_code == 200, second.text
            for response_id in (first.json()["id"], follow.json()["id"]):
                assert (await a.get(f"/v1/responses/{response_id}")).status_code == 404
            assert (await b.get(f"/v1/responses/{second.json()['id']}")).status_code == 200
            stored, strings = _sizes(database)
            assert strings == 1 and stored < len(second_image) + 4_000
        finally:
            for client in clients.values():
                await client.aclose()
