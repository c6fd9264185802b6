"""Shared test helpers: the repo root, fixture paths, a chdir'd tmp project, and loading a `scripts/` module."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = ROOT.parent / "shared"

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test with the working directory set to an empty tmp project."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def load_script(name: str):
    """Import ``scripts/<name>.py`` (not a package) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
