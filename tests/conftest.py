"""Shared test helpers: the repo root, fixture paths, and a chdir'd tmp project."""
from __future__ import annotations

import os
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
