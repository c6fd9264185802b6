"""Plain text helpers shared by the gym experts and the offline user: content words, sentences, related words."""
from __future__ import annotations

import re

__all__ = ["words", "sentences", "related", "shared"]

_STOP = frozenset("""a an the and or but if of to in on at for with about as by from into over under than then so
such this that these those it its is are was were be been being am do does did done have has had having can could
would should will shall may might must i me my mine we our you your yours he she they them their his her what which
who whom whose when where why how there here any some all each every both either neither no not nor only own same
too very just also more most other much many please tell let know like want prefer preferred preference
preferences particular specific kind sort thing things something anything get go make looking need needs yes
""".split())


def words(text: str) -> set[str]:
    """Content words: lower-case ``[a-z0-9]+`` tokens of >= 3 characters (numbers of any length) minus
    stop words, a plural ``s`` stripped (words longer than 3 letters not ending in ``ss``)."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", str(text or "").lower()):
        if w in _STOP or (len(w) < 3 and not w.isdigit()):
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def sentences(text: str) -> list[str]:
    """``text`` split after ``. ! ?`` and at line breaks, stripped, empty pieces dropped."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", str(text or "")) if s.strip()]


def related(a: str, b: str) -> bool:
    """Same word, or one a prefix of the other at least 5 letters long ("africa"/"african", "crash"/"crashed")."""
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 5 and long_.startswith(short)


def shared(these: set[str], those: set[str]) -> set[str]:
    """The words of ``these`` :func:`related` to a word of ``those``."""
    return {w for w in these if any(related(w, v) for v in those)}
