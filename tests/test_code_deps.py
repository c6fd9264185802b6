"""The one rule for code dependencies (mimesis_lab.code_deps): dvc.yaml's code deps and the resume
fingerprint both come from the files a module imports."""
from __future__ import annotations

from pathlib import Path

from mimesis_lab import code_deps
from mimesis_lab.code_deps import check, code_identity, module_files, stage_code_deps, stage_modules

ROOT = Path(__file__).resolve().parents[1]


def _package(tmp: Path) -> Path:
    """A tiny project: mimesis_lab/{a,b,c}.py where a imports b lazily, b imports nothing, c is unused."""
    pkg = tmp / "mimesis_lab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from mimesis_lab.b import g\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    (pkg / "c.py").write_text("import os\n")
    return tmp


def test_closure_follows_function_level_imports(tmp_path):
    root = _package(tmp_path)
    files = [str(f.relative_to(root)) for f in module_files("mimesis_lab.a", root)]
    # a's lazy import of b counts; c is not imported; the package __init__ always runs first
    assert files == ["mimesis_lab/__init__.py", "mimesis_lab/a.py", "mimesis_lab/b.py"]


def test_fingerprint_changes_with_imported_code_only(tmp_path):
    root = _package(tmp_path)
    before = code_identity("mimesis_lab.a", root)
    (root / "mimesis_lab" / "c.py").write_text("import sys\n")          # not imported by a
    code_deps._closure.cache_clear()
    assert code_identity("mimesis_lab.a", root) == before
    (root / "mimesis_lab" / "b.py").write_text("def g():\n    return 2\n")  # imported by a
    code_deps._closure.cache_clear()
    assert code_identity("mimesis_lab.a", root) != before


def test_training_stage_depends_on_its_job_module():
    assert stage_modules("python -m flows.train --phases agent_csd") == ["flows.train", "mimesis_lab.jobs.agent_csd",
                                                                         "mimesis_lab.train.prestart"]
    deps = stage_code_deps("python -m flows.train --phases agent_csd", ROOT)
    assert "mimesis_lab/jobs/agent_csd.py" in deps and "flows/train.py" in deps
    # a data stage needs none of the training code
    assert not [d for d in stage_code_deps("python -m stages.role_swap", ROOT) if "/train" in d or "/jobs" in d]


def test_dvc_yaml_code_deps_follow_the_rule():
    # run `python -m mimesis_lab.code_deps --write` after changing imports
    assert check(ROOT / "dvc.yaml") == []
