"""The Ray head is checked before any shard job is submitted, for real: heads started here the way a new user could
start them wrong fail `pivot run` with one line saying what the head lacks and how to start it, and no shard job
is submitted. (Every other Ray test passes the same check with a head started right.)

- this venv's `ray` started with the venv off PATH: a job's `python` is another interpreter, which cannot import
  the project's dependencies;
- a head without the AWS variables, for an s3:// warehouse: credentials are never forwarded to jobs, so a job
  cannot open the warehouse.
"""

from __future__ import annotations

import pytest

from pivot_jobs.cli import main as pivot

from .conftest import INGEST, make_project
from .ray_head import start_ray_head

pytestmark = pytest.mark.scenario


def _head(request, **kw):
    head = start_ray_head(num_cpus=1, **kw)
    request.addfinalizer(head.stop)
    return head


def _jobs(dashboard: str) -> list:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(dashboard).list_jobs()


def _run_fails_in_one_line(capsys) -> str:
    capsys.readouterr()
    assert pivot(["run", "--select", f"{INGEST},rollouts"]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_head_started_without_the_venv_on_path(tmp_path, request, in_project, capsys):
    head = _head(request, venv_on_path=False)
    in_project(make_project(tmp_path / "p", head, shards=2, limit_turns=2, batch_rows=2))
    line = _run_fails_in_one_line(capsys)
    assert f"the Ray head at {head.dashboard} cannot run shard jobs: a job's driver" in line, line
    assert "cannot import" in line and "venv first on PATH" in line, line
    jobs = _jobs(head.dashboard)
    assert len(jobs) == 1 and (jobs[0].metadata or {}).get("pivot_preflight") == "1"  # no shard job was submitted
    print(f"\n{line}")


def test_a_head_without_the_aws_variables_for_an_s3_warehouse(tmp_path, request, s3_env, in_project, capsys):
    head = _head(request, without=("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"))
    in_project(make_project(tmp_path / "p", head, warehouse=s3_env, shards=2, limit_turns=2, batch_rows=2))
    line = _run_fails_in_one_line(capsys)
    assert f"cannot open the warehouse {s3_env}: an s3:// warehouse needs AWS_ACCESS_KEY_ID" in line, line
    assert "with the warehouse's AWS variables in its environment" in line, line
    assert [(j.metadata or {}).get("pivot_preflight") for j in _jobs(head.dashboard)] == ["1"]
    print(f"\n{line}")
