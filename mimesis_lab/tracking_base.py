"""Provenance helpers shared by :mod:`mimesis_lab.tracking` and :mod:`mimesis_lab.tracking_queue`: the
project root, the tracking URI, the git commit and the ``dvc.lock`` hashes of a stage. No MLflow import."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from mimesis_lab.config import yaml_load

PARENT_ENV = "MIMESIS_PARENT_RUN_ID"


def project_root() -> Path:
    """The repository root (the folder holding ``params.yaml``), found from this file."""
    return Path(__file__).resolve().parent.parent


def resolve_tracking_uri(uri: str, root: Path | None = None) -> str:
    """Make a relative ``sqlite:///`` path absolute against the project root."""
    root = root or project_root()
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        db = (root / uri[len(prefix):]).resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        return f"{prefix}{db}"
    return uri


def git_commit(root: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root or project_root(), capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(root: Path | None = None) -> bool | None:
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root or project_root(), capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def dvc_lock_hashes(stage: str, root: Path | None = None) -> dict[str, str]:
    """``path -> md5`` of the stage's deps and outs as recorded in ``dvc.lock`` (empty if none)."""
    lock = (root or project_root()) / "dvc.lock"
    if not lock.exists():
        return {}
    data = yaml_load(lock.read_text()) or {}
    entry = (data.get("stages") or {}).get(stage) or {}
    out: dict[str, str] = {}
    for kind in ("deps", "outs"):
        for item in entry.get(kind) or []:
            if "md5" in item:
                out[f"{kind}:{item['path']}"] = item["md5"]
    return out
