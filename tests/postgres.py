"""A real PostgreSQL server for the tests: initdb into a temporary directory, pg_ctl start on a
free port (TCP for the stores, a Unix socket for the tests' own admin connection), stopped
at the end of the session.

The binaries are found on PATH, else in Debian's /usr/lib/postgresql/*/bin, else in the
`pgserver` wheel; with none, the tests that need the server skip and say why. initdb will
not run as root: as root, the server runs as the `postgres` user.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

USER = "nursery"
PASSWORD = "s3cret-pw-not-for-logs"
"""The stores connect over TCP with it (scram-sha-256): tests check it never shows."""


def _binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "pg_ctl").is_file() and (candidate / "initdb").is_file():
            return candidate
    with contextlib.suppress(ImportError, AttributeError):
        from pgserver import _commands  # type: ignore[import-not-found]

        return Path(_commands.POSTGRES_BIN_PATH)
    return None


def why_not() -> str | None:
    """Why no server can be started here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    if _binaries() is None:
        return "no PostgreSQL server binaries (pg_ctl, initdb) on PATH nor a pgserver wheel"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user for initdb to run as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class PostgresServer:
    bin: Path
    root: Path
    port: int
    _as_user: list[str]
    _names: Iterator[int] = attrs.field(factory=itertools.count)

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    def url(self, database: str, password: str = PASSWORD) -> str:
        """The URL a store connects with: TCP and the password, as a deployment's would."""
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str, params: tuple[Any, ...] = (), database: str = "postgres") -> Any:
        """Run `sql` as the superuser over the Unix socket; its rows, if it returns any."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir),
            port=self.port,
            user=USER,
            dbname=database,
            autocommit=True,
        ) as db:
            cursor = db.execute(sql, params)
            return cursor.fetchall() if cursor.description else None

    def new_database(self) -> str:
        """A fresh, empty database's name."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self.admin(f"CREATE DATABASE {name}")
        return name

    def cut_connections(self, database: str) -> int:
        """Terminate every session on `database` (as a server restart would); how many."""
        rows = self.admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        return len(rows)

    def allow_connections(self, database: str, allowed: bool) -> None:
        self.admin(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {'true' if allowed else 'false'}")

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._as_user, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), *args],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port}"
            f" -c unix_socket_directories={self.socket_dir}"
            " -c fsync=off -c full_page_writes=off -c max_connections=100"
        )
        self._pg_ctl("-w", "-l", str(self.root / "log"), "-o", options, "start")

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "immediate", "stop")


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A server for the session; `why_not()` must be None."""
    bin = _binaries()
    assert bin is not None
    root = Path(tempfile.mkdtemp(prefix="mlx-nursery-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    try:
        (root / "pw").write_text(PASSWORD)
        (root / "pw").chmod(0o644)
        subprocess.run(
            [
                *as_user,
                str(bin / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                USER,
                f"--pwfile={root / 'pw'}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run([*as_user, "mkdir", str(root / "run")], check=True)
        for attempt in range(3):  # the free port may be taken before the server binds it
            server = PostgresServer(bin, root, _free_port(), as_user)
            try:
                server.start()
                break
            except subprocess.CalledProcessError:
                if attempt == 2:
                    raise
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
