"""Which source files a module depends on: the one rule for code dependencies.

A module depends on its own file and, transitively, on every project module it imports
(module-level and function-level ``import`` statements alike, read from the AST; packages count
with their ``__init__.py``). Two consumers use this rule, so they cannot disagree:

- the resume fingerprint of a training job (:func:`code_identity` of the job module, see
  :func:`mimesis_lab.train.checkpoint.run_fingerprint`);
- ``dvc.yaml``: every stage's code deps are the files of the modules its command runs (for a
  training flow, also the job module it launches). They reach DVC as one *code fingerprint* per stage,
  ``data/code/<stage>.txt`` (``sha256  path`` per file, sorted), which the head stage ``code``
  (``python -m mimesis_lab.code_deps --fingerprints``, deps: the source packages) rewrites from the
  stages' current commands; a stage depends on its own fingerprint, so an edit re-runs exactly the
  stages whose modules import the edited file, as one dep per source file did. (DVC refuses
  ``dvc.yaml`` as a dep: a changed command re-runs its stage by itself, and its fingerprint follows
  at the next edit of the sources, which re-runs ``code``.) Why not one dep per file: DVC
  re-parses and re-writes ``dvc.lock`` around every stage with its pure-Python round-trip YAML,
  and ~1,150 file deps made that lock 6,300 lines, about 1.1 s of ``dvc repro`` per stage on 2
  cores (``bench/bench_overhead.py``). ``python -m mimesis_lab.code_deps --check`` compares
  ``dvc.yaml`` with the rule (a test runs it); ``--write`` rewrites the code deps in place.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["ROOT", "PACKAGES", "CODE_STAGE", "FINGERPRINT_DIR", "module_files", "code_identity", "stage_modules",
           "stage_code_deps", "stage_files", "fingerprint", "fingerprint_path", "write_fingerprints", "main"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mimesis_lab", "flows", "stages")
#: The head stage of dvc.yaml that writes every other stage's code fingerprint.
CODE_STAGE = "code"
#: Where the fingerprints live (``<stage>.txt``), relative to the project root.
FINGERPRINT_DIR = "data/code"

#: The job module each training phase runs (``python -m <module> --phase <phase>``; see
#: :mod:`mimesis_lab.train.launch`).
JOB_MODULES = {"midtrain": "mimesis_lab.jobs.sft", "sft": "mimesis_lab.jobs.sft",
               "agent_sft": "mimesis_lab.jobs.sft", "sim_rl": "mimesis_lab.jobs.sim_rl",
               "agent_grpo": "mimesis_lab.jobs.agent_grpo", "agent_csd": "mimesis_lab.jobs.agent_csd"}


def _file_of(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports(path: Path, module: str) -> frozenset[str]:
    """Project modules named by the import statements of ``path`` (``module`` is its dotted name); parsed
    once per version of the file (its mtime and size), as every closure of a process shares the files."""
    st = path.stat()
    return _parsed_imports(path, module, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=None)
def _parsed_imports(path: Path, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts if is_pkg else parts[:-1]
                base = base[:len(base) - (node.level - 1)]
                head = ".".join(base + ([node.module] if node.module else []))
            else:
                head = node.module or ""
            out.add(head)
            out.update(f"{head}.{a.name}" for a in node.names)   # `from pkg import submodule`
    return frozenset(m for m in out if m.split(".")[0] in PACKAGES)


@lru_cache(maxsize=None)
def _closure(module: str, root: Path) -> frozenset[Path]:
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        # a module's parent packages are imported (run) first
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        f = _file_of(m, root)
        if f is None:
            continue
        files.add(f)
        todo.extend(_imports(f, m))
    return frozenset(files)


def module_files(module: str, root: Path = ROOT) -> list[Path]:
    """The project source files ``module`` needs (itself, its packages, everything it imports), sorted."""
    if _file_of(module, root) is None:
        raise ModuleNotFoundError(f"{module}: no such project module under {root}")
    return sorted(_closure(module, root))


def code_identity(module: str, root: Path = ROOT) -> str:
    """sha256 over the paths and contents of :func:`module_files` of ``module``."""
    h = hashlib.sha256()
    for f in module_files(module, root):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def stage_modules(cmd: str) -> list[str]:
    """The modules a stage command runs: ``python -m M …`` → ``[M]``; a training flow
    (``flows.train --phases P …``) also runs the job module of each phase, and the runner of a job
    started ahead (:mod:`mimesis_lab.train.prestart`)."""
    m = re.match(r"\s*python\s+-m\s+([\w.]+)(.*)", cmd)
    if not m:
        raise ValueError(f"stage command {cmd!r} is not `python -m <module> …`")
    mods = [m.group(1)]
    if m.group(1) == "flows.train":
        args = m.group(2).split()
        phases = args[args.index("--phases") + 1:] if "--phases" in args else []
        phases = [p for p in phases if not p.startswith("-")]
        mods += sorted({JOB_MODULES[p] for p in phases})
        mods.append("mimesis_lab.train.prestart")   # a direct job started ahead runs through it
    return mods


def stage_files(cmd: str, root: Path = ROOT) -> list[Path]:
    """Every project source file of :func:`stage_modules` (no folder collapsing), sorted."""
    files: set[Path] = set()
    for mod in stage_modules(cmd):
        files.update(module_files(mod, root))
    return sorted(files)


def stage_code_deps(cmd: str, root: Path = ROOT) -> list[str]:
    """The files of :func:`stage_files`, relative to ``root``, with a folder listed instead of its files when
    every ``.py`` file under it is needed: the compact view of what a stage's fingerprint covers."""
    files = set(stage_files(cmd, root))
    out: list[str] = []
    covered: set[Path] = set()

    def full(folder: Path) -> bool:
        return all(f in files for f in folder.rglob("*.py"))

    for f in sorted(files):
        if f in covered:
            continue
        # the highest package folder (below the top-level package) whose every file is needed
        best = None
        for parent in reversed(f.relative_to(root).parents[:-1]):
            folder = root / parent
            if len(parent.parts) >= 2 and full(folder):
                best = folder
                break
        if best is not None:
            covered.update(best.rglob("*.py"))
            out.append(str(best.relative_to(root)))
        else:
            covered.add(f)
            out.append(str(f.relative_to(root)))
    return sorted(set(out))


def fingerprint(cmd: str, root: Path = ROOT) -> str:
    """A stage's code fingerprint: ``<sha256>  <path>`` for each of :func:`stage_files` (``sha256sum``'s
    layout, so ``sha256sum -c`` checks it), one per line."""
    return "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(root)}\n"
                   for f in stage_files(cmd, root))


def fingerprint_path(stage: str) -> str:
    return f"{FINGERPRINT_DIR}/{stage}.txt"


def _stages(dvc_path: Path) -> dict[str, dict]:
    import yaml

    return yaml.safe_load(dvc_path.read_text(encoding="utf-8"))["stages"]


def write_fingerprints(dvc_path: Path) -> list[str]:
    """Write ``data/code/<stage>.txt`` for every stage of ``dvc_path`` but :data:`CODE_STAGE` (a file whose
    content is unchanged is left alone); returns the stages whose fingerprint changed."""
    root = dvc_path.parent
    changed = []
    for name, st in _stages(dvc_path).items():
        if name == CODE_STAGE:
            continue
        path = root / fingerprint_path(name)
        text = fingerprint(st["cmd"], root)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


# ----------------------------------------------------------------------------- dvc.yaml
def _is_code(dep: str) -> bool:
    return dep.split("/")[0] in PACKAGES and not dep.startswith("${")


def _is_fingerprint(dep: str) -> bool:
    return dep.startswith(FINGERPRINT_DIR + "/")


def _code_stage_block(stages: list[str]) -> list[str]:
    """The ``code`` stage of dvc.yaml: the source packages in, one fingerprint per stage out (``persist``: DVC
    leaves the old fingerprints in place while the stage runs, so it reports the ones that changed)."""
    return [f"  {CODE_STAGE}:",
            "    # each stage's code fingerprint (mimesis_lab/code_deps.py): an edit re-runs the stages importing it",
            "    cmd: python -m mimesis_lab.code_deps --fingerprints",
            "    deps:", *(f"      - {p}" for p in PACKAGES),
            "    outs:", *(x for s in stages if s != CODE_STAGE for x in (f"      - {fingerprint_path(s)}:",
                                                                          "          cache: false",
                                                                          "          persist: true"))]


def _outs(st: dict) -> set[str]:
    return {next(iter(o)) if isinstance(o, dict) else o for o in st.get("outs", [])}


def check(dvc_path: Path) -> list[str]:
    """Where ``dvc.yaml`` breaks the rule: a stage that names source files itself or lacks its fingerprint dep,
    or a ``code`` stage that is missing, not first, or whose deps / outs are not the packages / every
    fingerprint. ``["stage: problem"]``."""
    stages = _stages(dvc_path)
    names = list(stages)
    problems = []
    if CODE_STAGE not in stages:
        return [f"{CODE_STAGE}: missing (run `python -m mimesis_lab.code_deps --write`)"]
    if names[0] != CODE_STAGE:
        problems.append(f"{CODE_STAGE}: not the first stage")
    code = stages[CODE_STAGE]
    if set(code.get("deps", [])) != set(PACKAGES):
        problems.append(f"{CODE_STAGE}: deps {code.get('deps')} != {list(PACKAGES)}")
    want_outs = {fingerprint_path(n) for n in names if n != CODE_STAGE}
    if _outs(code) != want_outs:
        problems.append(f"{CODE_STAGE}: outs missing {sorted(want_outs - _outs(code))}, "
                        f"extra {sorted(_outs(code) - want_outs)}")
    for name, st in stages.items():
        if name == CODE_STAGE:
            continue
        deps = [d for d in st.get("deps", []) if isinstance(d, str)]
        named = sorted(d for d in deps if _is_code(d))
        prints = sorted(d for d in deps if _is_fingerprint(d))
        if named or prints != [fingerprint_path(name)]:
            problems.append(f"{name}: source files named {named}, fingerprint deps {prints} "
                            f"(want only {fingerprint_path(name)})")
    return problems


def write(dvc_path: Path) -> None:
    """Rewrite the code deps of ``dvc.yaml`` (other lines, comments and order kept): every stage's source-file and
    fingerprint deps give way to its own fingerprint, and the ``code`` stage is (re)written as the first."""
    stages = _stages(dvc_path)
    lines = dvc_path.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    stage = None
    in_deps = skip = False

    def fp_dep() -> list[str]:
        return [f"      - {fingerprint_path(stage)}"]

    for line in lines:
        m = re.match(r"^  (\w+):\s*$", line)
        if m and m.group(1) in stages:
            if in_deps:
                out.extend(fp_dep())
            stage, in_deps = m.group(1), False
            skip = stage == CODE_STAGE              # rewritten below
        elif line.strip() and not line.startswith("   ") and not line.startswith("  #"):
            if in_deps:
                out.extend(fp_dep())
            stage, in_deps, skip = None, False, False
        if skip:
            continue
        if line == "stages:":
            out.append(line)
            out.extend(_code_stage_block(list(stages)))
            continue
        if stage and "deps" not in stages[stage] and re.match(r"^    cmd:", line):
            out.append(line)      # a stage without data deps still gets its fingerprint
            out.append("    deps:")
            out.extend(fp_dep())
            continue
        if stage and re.match(r"^    deps:\s*$", line):
            in_deps = True
            out.append(line)
            continue
        if in_deps:
            dm = re.match(r"^      - (\S+)\s*$", line)
            if dm:
                if not _is_code(dm.group(1)) and not _is_fingerprint(dm.group(1)):
                    out.append(line)
                continue
            out.extend(fp_dep())                      # end of the deps list
            in_deps = False
        out.append(line)
    if in_deps:
        out.extend(fp_dep())
    dvc_path.write_text("\n".join(out) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mimesis_lab.code_deps", description=__doc__.splitlines()[0])
    ap.add_argument("--dvc", default=str(ROOT / "dvc.yaml"))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml's code deps differ from the rule")
    g.add_argument("--write", action="store_true", help="rewrite dvc.yaml's code deps from the rule")
    g.add_argument("--module", help="print the files a module depends on")
    g.add_argument("--fingerprints", action="store_true",
                   help=f"write every stage's code fingerprint ({FINGERPRINT_DIR}/<stage>.txt; the `code` stage)")
    args = ap.parse_args(argv)
    if args.module:
        print("\n".join(str(f.relative_to(ROOT)) for f in module_files(args.module)))
        return 0
    if args.write:
        write(Path(args.dvc))
        return 0
    if args.fingerprints:
        changed = write_fingerprints(Path(args.dvc))
        print(f"code fingerprints changed: {', '.join(changed) if changed else 'none'}")
        return 0
    problems = check(Path(args.dvc))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
