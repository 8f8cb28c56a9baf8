"""PostgreSQL 15 from the machine image, started by the storage tests on 127.0.0.1 (a free port) and stopped when
done. The S3 store (SeaweedFS) is shared with the scale tests: tests/s3_store.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.s3_store import stop_server

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres_user(args: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: drop to the image's `postgres` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@pytest.fixture(scope="session")
def postgres():
    """PostgreSQL 15 from the machine image in a temp dir on 127.0.0.1: {"url": ..., "port": ...}."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL 15 binaries not found in {PG_BIN}")
    # not under pytest's tmp dir: that is private to root, and the server runs as `postgres` when we are root
    root = Path(tempfile.mkdtemp(prefix="pivot-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run(_as_postgres_user([str(PG_BIN / "initdb"), "-D", str(data), "-U", "pivot", "--auth=trust",
                                      "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(_as_postgres_user([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port),
                                               "-h", "127.0.0.1", "-k", str(sock), "-c", "fsync=off"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("postgres did not start")
            time.sleep(0.2)
        subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "pivot", "dagster"],
                       check=True, capture_output=True)
        # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; dagster-postgres installs psycopg2
        yield {"url": f"postgresql+psycopg2://pivot@127.0.0.1:{port}/dagster",
               "libpq_url": f"postgresql://pivot@127.0.0.1:{port}/dagster", "port": port}
    finally:
        stop_server(proc)
        shutil.rmtree(root, ignore_errors=True)
