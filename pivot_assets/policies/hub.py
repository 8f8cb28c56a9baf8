"""Models named by a Hugging Face Hub id: `org/name`, or `org/name@revision` (a branch, a tag or a commit).

An id resolves to a snapshot dir of the Hub cache ($HF_HUB_CACHE, else $HF_HOME/hub): from the cache first, so a
cached model never touches the network; else downloaded, unless HF_HUB_OFFLINE is set; else a `HubModelMissing`
whose one line names the id, the cache searched and the command that fetches it. `hf download` of a newer commit
moves the cache's `refs/<revision>` to it, and the id then resolves to that snapshot.

A snapshot's commit (its dir's name) is the model's identity: the files of one commit are the same wherever the
cache lives, and another commit is another model (policies/models.policy_fingerprint, the rollouts' code version).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# what the Hub accepts as `org/name` (letters, digits, . _ -); a revision is any name after the `@`
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "on", "yes", "true"}


class HubModelMissing(ValueError):
    """A Hub id that resolves to no snapshot here, phrased as one line with the command that fetches it."""


@dataclass(frozen=True)
class HubId:
    repo_id: str  # org/name
    revision: str | None = None  # a branch, tag or commit; None: the repo's default branch (main)

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    @property
    def fetch_command(self) -> str:
        return f"hf download {self.repo_id}" + (f" --revision {self.revision}" if self.revision else "")


def parse_hub_id(model: str) -> HubId | None:
    """The Hub id `model` names (`org/name` or `org/name@revision`), or None when it is no such id."""
    repo_id, at, revision = model.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or (at and not revision.strip()) or any(c.isspace() for c in revision):
        return None
    return HubId(repo_id, revision or None)


def hub_cache_dir() -> Path:
    """The Hub cache as huggingface_hub finds it, read from the environment at each call: huggingface_hub reads
    its constants once at import, before a caller (or a test) sets HF_HOME."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, now or when it was imported."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def cached_snapshot(hub_id: HubId, cache: Path | None = None) -> Path | None:
    """The snapshot dir the id resolves to in the cache (through refs/<revision>, or the commit itself), None when
    it is not there or lacks config.json (a download that was interrupted). Never touches the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=cache or hub_cache_dir(),
                                      local_files_only=True))
    except LocalEntryNotFoundError:
        return None
    return path if (path / "config.json").is_file() else None


# quoted in docs/troubleshooting.md (generated from here)
NOT_CACHED_OFFLINE = ("Hub model {hub_id} is not in the cache {cache} and HF_HUB_OFFLINE is set: fetch it "
                      "with `{fetch_command}` where the network is allowed (or unset HF_HUB_OFFLINE)")


def snapshot_dir(hub_id: HubId) -> Path:
    """The id's snapshot dir: from the cache, else downloaded where the network is allowed; HubModelMissing else."""
    cache = hub_cache_dir()
    cached = cached_snapshot(hub_id, cache)
    if cached is not None:
        return cached
    if hub_offline():
        raise HubModelMissing(NOT_CACHED_OFFLINE.format(hub_id=hub_id, cache=cache, fetch_command=hub_id.fetch_command))
    return _download(hub_id, cache)


def _download(hub_id: HubId, cache: Path) -> Path:
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=cache))
    except Exception as e:  # noqa: BLE001  (no network, unknown repo or revision, gated: one line for each)
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubModelMissing(f"Hub model {hub_id} is not in the cache {cache} and could not be downloaded ({why}): "
                              f"fetch it with `{hub_id.fetch_command}`") from None
    if not (path / "config.json").is_file():
        raise HubModelMissing(f"Hub model {hub_id}: its snapshot {path} has no config.json (not a transformers model?)")
    return path


def snapshot_commit(path: Path) -> str | None:
    """The commit a Hub cache snapshot dir holds (`.../models--org--name/snapshots/<commit>`), else None."""
    path = Path(path)
    in_snapshots = path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--")
    return path.name if in_snapshots and _COMMIT.fullmatch(path.name) else None


def pinned_id(model: str) -> str:
    """`org/name@<commit>` for a Hub id found in the cache, `model` unchanged otherwise (a local dir, `embedded`,
    an id not fetched yet). For code versions: a newer snapshot at the same id is another version, a moved cache
    is not. Looks in the cache only: building the definitions (the UI, `pivot stale`) never downloads a model."""
    hub_id = parse_hub_id(model)
    if hub_id is None or Path(model).expanduser().exists():
        return model
    path = cached_snapshot(hub_id)
    return f"{hub_id.repo_id}@{path.name}" if path is not None else model
