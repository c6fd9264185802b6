"""The project's import graph: no cycles, and no private name imported across packages (STYLE 2).

The graph is read from the source, not by importing anything: every ``import`` / ``from … import``
statement of every module under ``mimesis_lab/``, ``flows/`` and ``stages/`` — at module level, inside
functions and under ``if TYPE_CHECKING:`` alike — is an edge to the project module it names
(``from a.b import c`` names the module ``a.b.c`` when that is a module, else ``a.b``; relative imports
are resolved). A package's ``__init__`` counts as the package itself; importing ``a.b.c`` is not counted
as importing ``a.b`` too (a package that re-exports its modules is not a cycle).

A *package* here is ``mimesis_lab.<subpackage>`` (``mimesis_lab.evals``, ``mimesis_lab.rl``, …),
``mimesis_lab`` itself for its top-level modules, ``flows`` or ``stages``. ``from <module of another
package> import _name`` is the private import this test forbids: code two packages share gets a
public name (``mimesis_lab.evals`` importing ``_x`` from ``mimesis_lab.rl`` is one; ``mimesis_lab.abcd``
importing ``_ws`` from ``mimesis_lab.abcd_policy`` is not).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mimesis_lab", "flows", "stages")

# Known offenders, each in files other work owns. An entry that no longer occurs fails the test:
# delete it then, so the list only shrinks.
# Both lists are empty and may only stay so: a new cycle or private import fails the test.
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_OFFENDERS: set[tuple[str, str, str]] = set()


def project_modules() -> dict[str, tuple[Path, bool]]:
    """``dotted name -> (file, is_package)`` of every project module."""
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _from_target(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str, int]]]:
    """``(edges, from_imports)``: project module -> project modules it imports, and every
    ``(importer, imported-from module, name, line)`` of a ``from … import name`` of a project module."""
    mods = project_modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    names: list[tuple[str, str, str, int]] = []
    for mod, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges[mod].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(mod, is_pkg, node)
                if target.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        edges[mod].add(sub)
                    else:
                        if target in mods:
                            edges[mod].add(target)
                        names.append((mod, target, alias.name, node.lineno))
    return edges, names


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges[v]:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """``mimesis_lab.<subpackage>``, ``mimesis_lab`` for a top-level module, else the top package."""
    parts = module.split(".")
    if parts[0] == "mimesis_lab" and len(parts) > 1 and (ROOT / "mimesis_lab" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def private_imports(names: list[tuple[str, str, str, int]]) -> list[tuple[str, str, str, int]]:
    return [(mod, target, name, line) for mod, target, name, line in names
            if name.startswith("_") and not name.startswith("__") and package_of(mod) != package_of(target)]


def test_the_graph_sees_every_kind_of_import():
    # worked example of what counts as an edge, on modules whose imports we know
    edges, names = import_graph()
    assert "mimesis_lab.judges.verdict" in edges["mimesis_lab.judges.openai_judge"]           # module level
    assert "mimesis_lab.judges.openai_judge" in edges["mimesis_lab.judges.behavior_judge"]   # in make_judge
    assert "mimesis_lab.judges.behavior_judge" in edges["mimesis_lab.judges"]                 # a package __init__
    assert ("mimesis_lab.abcd", "mimesis_lab.abcd_policy", "_ws") in {n[:3] for n in names}   # same package
    assert package_of("mimesis_lab.evals.sim_eval") == "mimesis_lab.evals"
    assert package_of("mimesis_lab.abcd_policy") == "mimesis_lab" and package_of("flows.eval") == "flows"


def test_no_import_cycles():
    found = {frozenset(c) for c in cycles(import_graph()[0])}
    new = sorted(sorted(c) for c in found - KNOWN_CYCLES)
    assert not new, f"import cycles (break them by moving the shared piece where it belongs): {new}"
    gone = sorted(sorted(c) for c in KNOWN_CYCLES - found)
    assert not gone, f"these known cycles are gone; delete them from KNOWN_CYCLES: {gone}"


def test_no_private_imports_across_packages():
    found = private_imports(import_graph()[1])
    new = [f"{path}:{line}: from {target} import {name}"
           for mod, target, name, line in found if (mod, target, name) not in KNOWN_OFFENDERS
           for path in [project_modules()[mod][0].relative_to(ROOT)]]
    assert not new, "private names imported across packages (give them a public name):\n" + "\n".join(new)
    gone = sorted(KNOWN_OFFENDERS - {f[:3] for f in found})
    assert not gone, f"these known offenders are gone; delete them from KNOWN_OFFENDERS: {gone}"


def test_the_training_toolkit_imports_neither_rl_nor_jobs():
    """``mimesis_lab.train`` is the public toolkit the recipes build on; it must not reach back into them."""
    edges, _ = import_graph()
    back = sorted((m, t) for m, targets in edges.items() if m.startswith("mimesis_lab.train")
                  for t in targets if t.startswith(("mimesis_lab.rl", "mimesis_lab.jobs")))
    assert back == []
