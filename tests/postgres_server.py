"""A real Postgres server for the scale profile's tests, started here in a temporary folder
(Debian's postgresql 15, installed by scripts/setup.sh) and stopped at the end of the session.
Postgres refuses to run as root: as root the server runs as the `postgres` user. A test folder's
conftest imports the fixtures (`postgres_server`, `pg_dsn`) from here."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The address of a fresh Postgres server (user `tica`, trust auth, loopback only)."""
    initdb = BIN / "initdb" if (BIN / "initdb").exists() else shutil.which("initdb")
    if initdb is None:
        pytest.fail("no Postgres server binaries (scripts/setup.sh installs Debian's postgresql)")
    # not under pytest's tmp folder: that one is private to root, and the server runs as postgres
    root = Path(tempfile.mkdtemp(prefix="tica-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", _free_port()
    subprocess.run(_as_server_user([str(initdb), "-D", str(data), "-A", "trust", "-U", "tica", "--no-sync", "-E", "UTF8"]),
                   check=True, capture_output=True)
    pg_ctl = str(Path(initdb).with_name("pg_ctl"))
    subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-o",
                                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                                    "-c max_connections=100", "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql://tica@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres_server) -> str:
    """A new, empty database on the session's server: one per test."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return f"{postgres_server}/{name}"
