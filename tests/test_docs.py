"""The documents the code cites live in the repository, and every citation points at a real section.

``SPEC §x.y`` is section ``x.y`` of ``docs/spec.md``, ``DESIGN §n`` section ``n`` of ``docs/design.md``
(README says so). A section is a Markdown heading that starts with its number: ``## 3.3 CSD …``,
``### 3.3.1 Privileged channel``. A citation may name several sections: ``SPEC §2.3–2.4, §6`` cites 2.3,
2.4 and 6, ``SPEC §3.1/§3.3`` cites 3.1 and 3.3; ``SPEC.md §4`` is read as ``SPEC §4``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"SPEC": ROOT / "docs" / "spec.md", "DESIGN": ROOT / "docs" / "design.md"}
CITING = ("mimesis_lab", "flows", "stages", "scripts", "bench", "tests")
NUMBER = r"\d+(?:\.\d+)*"
CITATION = re.compile(rf"\b(SPEC|DESIGN)(?:\.md)?\s?§({NUMBER}(?:\s?(?:[–-]|,\s?§|/\s?§|;\s?§)\s?{NUMBER})*)")
HEADING = re.compile(rf"^#{{1,6}}\s+({NUMBER})\.?\s+\S", re.MULTILINE)


def sections(doc: str) -> set[str]:
    """The section numbers of one document's headings."""
    return set(HEADING.findall(DOCS[doc].read_text(encoding="utf-8")))


def citations(text: str) -> list[tuple[str, str]]:
    """``(document, section)`` of every citation in ``text``."""
    return [(doc, number) for doc, refs in CITATION.findall(text) for number in re.findall(NUMBER, refs)]


def cited_in_code() -> list[tuple[str, int, str, str]]:
    """``(file, line, document, section)`` of every citation in the project's source files."""
    found = []
    for top in CITING:
        for path in sorted((ROOT / top).rglob("*.py")):
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found += [(str(path.relative_to(ROOT)), lineno, d, n) for d, n in citations(line)]
    return found


def test_citation_syntax_worked_examples():
    assert citations("(SPEC §2.3–2.4, §6)") == [("SPEC", "2.3"), ("SPEC", "2.4"), ("SPEC", "6")]
    assert citations("SPEC §3.1/§3.3 and SPEC §3.3 item 3.") == [("SPEC", "3.1"), ("SPEC", "3.3"), ("SPEC", "3.3")]
    assert citations("(SPEC.md §4; DESIGN.md §4 contracts)") == [("SPEC", "4"), ("DESIGN", "4")]
    assert citations("SPEC §3.1, DESIGN §5") == [("SPEC", "3.1"), ("DESIGN", "5")]
    assert citations("SPEC §3.3.1: the shim") == [("SPEC", "3.3.1")]


def test_the_documents_have_numbered_sections():
    assert {"1", "2.1", "2.4", "3.3", "3.3.1", "3.3.8", "4.2", "6"} <= sections("SPEC")
    assert {"1", "2", "4", "5", "6", "6.1"} <= sections("DESIGN")


def test_the_code_cites_something():
    # the scan really reads the sources (a broken pattern would pass every check below vacuously)
    found = cited_in_code()
    assert len(found) > 100 and {d for _, _, d, _ in found} == {"SPEC", "DESIGN"}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_citation_resolves_to_a_section(doc):
    known = sections(doc)
    dangling = [f"{file}:{line}: {d} §{n}" for file, line, d, n in cited_in_code() if d == doc and n not in known]
    assert not dangling, f"citations of sections {DOCS[doc].relative_to(ROOT)} does not have:\n" + "\n".join(dangling)


def test_readme_says_what_the_citations_mean_and_links_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "SPEC §x = docs/spec.md section x, DESIGN §x = docs/design.md section x" in readme
    for doc in ("docs/spec.md", "docs/design.md", "docs/cpu-notes.md", "docs/data-contracts.md"):
        assert f"]({doc})" in readme, f"README does not link {doc}"


def test_relative_links_of_the_docs_resolve():
    broken = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text(encoding="utf-8")):
            if "://" not in target and not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
