"""The simulator's output format ``<think>reasoning</think>utterance`` (SPEC §2.3).

With thinking on, a reply that does not follow the format is a *format failure*: its
update reward is 0 while the raw judged score is kept and logged apart (so the logged
score and the update reward can differ). The public log keeps only the utterance; the
private log keeps reasoning + utterance.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ParsedReply:
    """``ok`` with ``reasoning`` and ``utterance``, or a format failure with its ``error``."""

    ok: bool
    reasoning: str
    utterance: str
    error: str | None = None


def strip_end_tokens(text: str) -> str:
    """``text`` stripped, without trailing end-of-turn tokens (:data:`END_TOKENS`, repeated or mixed)."""
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for tok in END_TOKENS:
            if text.endswith(tok):
                text = text[: -len(tok)].rstrip()
                changed = True
    return text


def parse_reply(text: str, require_think: bool = True) -> ParsedReply:
    """Split a generated reply into reasoning and public utterance.

    Valid: optional whitespace, exactly one ``<think>…</think>`` block at the start, then a
    non-empty utterance with no further think tags (end-of-turn tokens are ignored). With
    ``require_think=False`` a reply without any think block is valid (reasoning ``""``).
    """
    body = strip_end_tokens(text)
    n_open, n_close = body.count(OPEN), body.count(CLOSE)
    if n_open == 0 and n_close == 0:
        if require_think:
            return ParsedReply(False, "", body, "missing <think> block")
        return (ParsedReply(True, "", body) if body else ParsedReply(False, "", "", "empty utterance"))
    if not body.startswith(OPEN):
        return ParsedReply(False, "", public_text(body), "reply does not start with <think>")
    if n_close == 0:
        return ParsedReply(False, body[len(OPEN):].strip(), "", "unclosed <think> block")
    if n_open > 1 or n_close > 1:
        return ParsedReply(False, "", public_text(body), "more than one think block")
    reasoning, utterance = body[len(OPEN):].split(CLOSE, 1)
    utterance = utterance.strip()
    if not utterance:
        return ParsedReply(False, reasoning.strip(), "", "empty utterance")
    return ParsedReply(True, reasoning.strip(), utterance)


_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def public_text(text: str) -> str:
    """What the partner may see: every think block (closed or not) and end tokens removed."""
    return _THINK_RE.sub("", strip_end_tokens(text)).strip()


def update_reward(raw_score: float, parsed: ParsedReply) -> float:
    """Training (update) reward: the raw score, or 0 on a format failure (the raw score is logged apart)."""
    return float(raw_score) if parsed.ok else 0.0
