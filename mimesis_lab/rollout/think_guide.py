"""Format-guided decoding of a simulator reply ``<think>reasoning</think>utterance`` (SPEC §2.3).

The serving-side counterpart of vLLM's structured outputs, for the one grammar the user side needs. A request
with ``think_format`` (:class:`~mimesis_lab.rollout.backends.SamplingParams`) is decoded under a per-row state
machine that masks the logits before sampling, so every reply parses with
:func:`mimesis_lab.envs.output_format.parse_reply`:

- ``open``: the first token is ``<think>`` (forced);
- ``think``: no second ``<think>``, no end of turn and no other special token inside the block; once only
  ``reserve`` new tokens are left the block is closed with ``</think>`` (forced), so the utterance always has
  room (``reserve = max(1, max_new_tokens // 4)``, :func:`utterance_reserve`);
- ``first``: the utterance's first token is neither a think tag, a special token, an end of turn nor
  whitespace only (the utterance is never empty);
- ``utter``: no think tag and no special token other than the end of turn.

Where the model would have written a well-formed reply anyway nothing changes: masking only removes tokens the
format forbids, and the model's own ``</think>`` and end of turn stay allowed where the format allows them.
Each row counts ``guided``: the steps at which the model's most likely token was masked (the guide overrode the
model), and ``forced_close``: whether the block was closed for lack of room. These are the measure of how much
the guide did, reported by the server (``ModelServer.stats``) and per agent RL step (``user/guided_*``).

Why: a small simulator trained on ThoughtTrace leaves most of its replies in the agent gyms unclosed
(``user endpoint returned an empty public reply``: 40 of the first 64 GRPO rollouts of the default run were
invalid for it), so agent RL learns from the few episodes the user happened to finish. The user's *content* is
still the frozen model's; the guide only keeps it inside the format the model was trained to produce. It is a
decoding choice of the Stage II environment (``agent_rl.user.think_format``), never used where the format
itself is measured (``sft`` format eval, ``sim_rl``, ``sim_eval``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["OPEN", "THINK", "FIRST", "UTTER", "DONE", "ThinkTokens", "ThinkGuide", "think_tokens", "utterance_reserve"]

OPEN, THINK, FIRST, UTTER, DONE = 0, 1, 2, 3, 4     # DONE: the row wrote its end of turn (left alone)


def utterance_reserve(max_new_tokens: int) -> int:
    """Tokens kept for the utterance: the think block is closed when only this many are left."""
    return max(1, max_new_tokens // 4)


@dataclass(frozen=True)
class ThinkTokens:
    """The token ids the grammar needs: the two tags, every special token, and whitespace-only tokens."""

    open_id: int
    close_id: int
    special: frozenset[int]
    blank: frozenset[int]


def think_tokens(tokenizer) -> ThinkTokens:
    """:class:`ThinkTokens` of ``tokenizer`` (decodes the whole vocabulary once: a caller keeps the result, as
    :class:`~mimesis_lab.rollout.backends.TransformersBackend` does per backend). Raises ``ValueError`` if
    ``<think>`` or ``</think>`` is not a single token of its vocabulary."""
    ids = []
    for tag in ("<think>", "</think>"):
        i = tokenizer.convert_tokens_to_ids(tag)
        unk = getattr(tokenizer, "unk_token_id", None)
        if i is None or (unk is not None and i == unk) or tokenizer.decode([i]) != tag:
            raise ValueError(f"think_format needs {tag!r} as a single token of the tokenizer; it is not one")
        ids.append(int(i))
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    special |= {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
    n = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    blank = frozenset(i for i, t in enumerate(texts) if not t.strip())
    return ThinkTokens(ids[0], ids[1], frozenset(special), blank)


@dataclass
class ThinkGuide:
    """The per-row state machine of one generation batch (module docstring).

    ``mask(logits, rows, step)`` edits the logits of the rows still generating in place (row ``j`` of
    ``logits`` is batch row ``rows[j]``); ``advance(row, token)`` moves a row's state after its token is chosen.
    """

    tokens: ThinkTokens
    n_rows: int
    max_new_tokens: int
    stop_ids: frozenset[int]
    state: list[int] = field(default_factory=list)
    guided: list[int] = field(default_factory=list)
    forced_close: list[bool] = field(default_factory=list)
    _masks: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.state = [OPEN] * self.n_rows
        self.guided = [0] * self.n_rows
        self.forced_close = [False] * self.n_rows
        self.reserve = utterance_reserve(self.max_new_tokens)

    def _banned(self, state: int, vocab: int, device) -> torch.Tensor:
        """Boolean ``[vocab]`` mask of the tokens ``state`` forbids (``open`` is handled by forcing)."""
        if state not in self._masks:
            t = self.tokens
            other_special = t.special - {t.open_id, t.close_id}
            if state == THINK:
                ban = (other_special | self.stop_ids | {t.open_id})
            elif state == FIRST:
                ban = other_special | self.stop_ids | t.blank | {t.open_id, t.close_id}
            else:
                ban = (other_special - self.stop_ids) | {t.open_id, t.close_id}
            m = torch.zeros(vocab, dtype=torch.bool, device=device)
            idx = [i for i in ban if i < vocab]
            if idx:
                m[torch.tensor(idx, dtype=torch.long, device=device)] = True
            self._masks[state] = m
        return self._masks[state]

    def _force(self, logits_row: torch.Tensor, token: int) -> None:
        keep = logits_row[token].clone()
        logits_row.fill_(float("-inf"))
        logits_row[token] = keep if torch.isfinite(keep) else 0.0

    def mask(self, logits: torch.Tensor, rows: list[int], step: int) -> torch.Tensor:
        """Apply the grammar to ``logits`` (``[len(rows), vocab]``, edited in place and returned)."""
        left = self.max_new_tokens - step
        top = logits.argmax(dim=-1).tolist()
        vocab = logits.shape[-1]
        for j, r in enumerate(rows):
            s = self.state[r]
            if s == DONE:
                continue
            if s == OPEN:
                target = self.tokens.open_id
            elif s == THINK and left <= self.reserve:
                target = self.tokens.close_id
                self.forced_close[r] = top[j] != target
            else:
                target = None
            if target is not None:
                self.guided[r] += top[j] != target
                self._force(logits[j], target)
                continue
            banned = self._banned(s, vocab, logits.device)
            self.guided[r] += bool(banned[top[j]])
            logits[j].masked_fill_(banned, float("-inf"))
        return logits

    def advance(self, row: int, token: int) -> None:
        s, t = self.state[row], self.tokens
        if s == OPEN:
            self.state[row] = THINK
        elif s == THINK and token == t.close_id:
            self.state[row] = FIRST
        elif s == FIRST:
            self.state[row] = UTTER
        elif s == UTTER and token in self.stop_ids:
            self.state[row] = DONE
