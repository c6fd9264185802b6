"""The one rule for code dependencies (mimesis_lab.code_deps): dvc.yaml's code deps and the resume
fingerprint both come from the files a module imports."""
from __future__ import annotations

from pathlib import Path

from mimesis_lab import code_deps
from mimesis_lab.code_deps import (CODE_STAGE, check, code_identity, fingerprint, fingerprint_path, module_files,
                                   stage_code_deps, stage_files, stage_modules, write, write_fingerprints)

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
    # run `python -m mimesis_lab.code_deps --write` after adding a stage
    assert check(ROOT / "dvc.yaml") == []


def test_fingerprint_lists_every_file_of_the_stage_with_its_sha256(tmp_path):
    import hashlib

    root = _package(tmp_path)
    text = fingerprint("python -m mimesis_lab.a", root)
    a = (root / "mimesis_lab" / "a.py").read_bytes()
    assert text.splitlines() == [f"{hashlib.sha256((root / p).read_bytes()).hexdigest()}  {p}" for p in
                                 ("mimesis_lab/__init__.py", "mimesis_lab/a.py", "mimesis_lab/b.py")]
    assert hashlib.sha256(a).hexdigest() in text
    # the project's stages: the fingerprint covers the same files as the collapsed dep list
    cmd = "python -m flows.train --phases agent_csd"
    listed = [line.split("  ", 1)[1] for line in fingerprint(cmd, ROOT).splitlines()]
    assert listed == [str(f.relative_to(ROOT)) for f in stage_files(cmd, ROOT)]
    covered = {d for d in stage_code_deps(cmd, ROOT)}
    assert all(p in covered or any(p.startswith(d + "/") for d in covered) for p in listed)


DVC = """# a pipeline
stages:
  a:
    cmd: python -m mimesis_lab.a
    deps:
      - data/in.txt
      - mimesis_lab/a.py
    outs:
      - data/a.txt
  c:
    cmd: python -m mimesis_lab.c
    outs:
      - data/c.txt
"""


def test_write_gives_each_stage_its_fingerprint_and_check_flags_drift(tmp_path):
    import yaml

    root = _package(tmp_path)
    dvc = root / "dvc.yaml"
    dvc.write_text(DVC)
    assert check(dvc) == [f"{CODE_STAGE}: missing (run `python -m mimesis_lab.code_deps --write`)"]
    write(dvc)
    stages = yaml.safe_load(dvc.read_text())["stages"]
    assert list(stages) == [CODE_STAGE, "a", "c"] and check(dvc) == []
    assert stages["a"]["deps"] == ["data/in.txt", fingerprint_path("a")]     # source files give way
    assert stages["c"]["deps"] == [fingerprint_path("c")]                     # a stage without deps gets one
    assert stages[CODE_STAGE]["deps"] == ["mimesis_lab", "flows", "stages"]
    assert [next(iter(o)) for o in stages[CODE_STAGE]["outs"]] == [fingerprint_path("a"), fingerprint_path("c")]
    assert dvc.read_text().startswith("# a pipeline\nstages:\n")              # comments kept
    before = dvc.read_text()
    write(dvc)
    assert dvc.read_text() == before                                          # idempotent
    # drift: a stage naming a source file again, or losing its fingerprint
    dvc.write_text(before.replace("      - data/code/c.txt\n", "      - mimesis_lab/c.py\n"))
    assert [p.split(":")[0] for p in check(dvc)] == ["c"]


def test_fingerprints_change_only_for_stages_importing_the_edit(tmp_path):
    root = _package(tmp_path)
    dvc = root / "dvc.yaml"
    dvc.write_text(DVC)
    write(dvc)
    assert write_fingerprints(dvc) == ["a", "c"]                 # first run: all written
    assert write_fingerprints(dvc) == []                         # nothing changed: files left alone
    (root / "mimesis_lab" / "b.py").write_text("def g():\n    return 3\n")   # a imports b, c does not
    code_deps._closure.cache_clear()
    assert write_fingerprints(dvc) == ["a"]
    (root / "mimesis_lab" / "__init__.py").write_text("# every module's package\n")
    code_deps._closure.cache_clear()
    assert write_fingerprints(dvc) == ["a", "c"]
