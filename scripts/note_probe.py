"""Does an agent checkpoint read the coach's notes? The premise of CSD, measured on held-out warm-start turns.

CSD's teacher is the agent itself given the coach's note (SPEC §3.3 items 4–5): it carries coaching only if
the agent's next reply depends on the note. For every ``coached`` row of the ``agent_traces`` validation
split (the expert's rewarded turn after the template coach's note, ``agent_traces.coached_share``) this probe
scores the expert's reply in the teacher-row layout (history + note as a user message + the reply) under

- the real note, a **placebo** (the note of the pair's other copy: the same history, another reply), and
  no note;

and prints the mean log-prob per reply token of each, the paired differences real − placebo (the argument
of CSD's gate with the placebo correction) and real − none, with 95% bootstrap CIs over rows, and, by greedy
decoding, how often the reply's choice (``[action]`` / ``[answer]``) is the one the note recommends under the
real note, under the placebo and without a note.

    python scripts/note_probe.py models/agent_sft/final [--data data/agent_sft/val.parquet] [--json out.json]
    python scripts/note_probe.py models/agent_sft/final --rollouts models/agent_csd/rollouts.jsonl [--limit 300]

``--rollouts``: the same question on RL's own turns: the template coach's note on each agent turn of the
CSD run's rollouts (the coach's input as in the job), the reply's log-prob under it minus under a placebo
note, by gym, note kind (the coach's cue) and the reply's choice.

A diagnostic, not a test (README "Why CSD ties GRPO").
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ci(xs: list[float]) -> list[float]:
    """The report's percentile bootstrap over rows (:func:`mimesis_lab.evals.effects.bootstrap_ci`); NaN under 2."""
    from mimesis_lab.evals.effects import bootstrap_ci
    return bootstrap_ci(xs) or [float("nan"), float("nan")]


class Scorer:
    """An agent checkpoint scoring replies in CSD's teacher-row layout (history + note + reply)."""

    def __init__(self, checkpoint: str):
        from mimesis_lab.models import load_model
        from mimesis_lab.tokenizer import load_tokenizer

        self.model, self.tok = load_model(checkpoint).eval(), load_tokenizer(checkpoint)

    def encode(self, messages: list[dict], generation_prompt: bool) -> list[int]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return list(self.tok.encode(text, add_special_tokens=False))

    def render(self, history: list[dict], note: str | None) -> list[int]:
        return self.encode(history + ([{"role": "user", "content": note}] if note is not None else []), True)

    def reply_ids(self, history: list[dict], note: str, reply: str) -> list[int]:
        """The reply's token ids as the chat template renders it after ``history`` and ``note``."""
        msgs = history + [{"role": "user", "content": note}]
        return self.encode(msgs + [{"role": "assistant", "content": reply}], False)[len(self.encode(msgs, True)):]

    def logp(self, prefix: list[int], reply: list[int]) -> float:
        """Mean log-prob per token of ``reply`` after ``prefix``."""
        import torch

        with torch.no_grad():
            ids = torch.tensor([prefix + reply])
            logp = torch.log_softmax(self.model(ids).logits[0, :-1].float(), -1)
            lp = logp.gather(-1, ids[0, 1:, None])[:, 0][len(prefix) - 1:]
        return float(lp.mean())

    def greedy_choice(self, prefix: list[int], max_new_tokens: int = 8) -> str:
        import torch

        tok = self.tok
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prefix]), max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id)
        text = tok.decode(out[0, len(prefix):], skip_special_tokens=True).strip()
        return text[1:].split("]")[0] if text.startswith("[") and "]" in text else "other"


def probe(checkpoint: str, data: str = "data/agent_sft/val.parquet", *, limit: int | None = None
          ) -> dict[str, Any]:
    import polars as pl

    from mimesis_lab.judges.coach import NOTES

    df = pl.read_parquet(data)
    rows = df.filter(pl.col("kind") == "coached").get_column("messages").to_list()[:limit]
    if not rows:
        raise SystemExit(f"{data}: no `coached` row (agent_traces.coached_share is 0?)")
    # the copies come in pairs (stages/agent_traces.py: coached_rows): the placebo is the partner's note
    partner = {}
    for i in range(0, len(rows) - 1, 2):
        if rows[i][:-2] == rows[i + 1][:-2]:
            partner[i], partner[i + 1] = rows[i + 1][-2]["content"], rows[i][-2]["content"]
    sc = Scorer(checkpoint)
    ask_note = NOTES["unmet"].format(cats="")
    real_placebo, real_none, lps = [], [], {"real": [], "placebo": [], "none": []}
    follows = {"real": 0, "placebo": 0, "none": 0}
    for i, msgs in enumerate(rows):
        history, note, reply = [dict(m) for m in msgs[:-2]], msgs[-2]["content"], msgs[-1]["content"]
        want = reply[1:].split("]")[0]                      # the recommended choice: action / answer
        placebo = partner.get(i) or (ask_note if note == NOTES["ready"] else NOTES["ready"])
        reply_ids = sc.reply_ids(history, note, reply)
        got = {}
        for name, n in (("real", note), ("placebo", placebo), ("none", None)):
            prefix = sc.render(history, n)
            got[name] = sc.logp(prefix, reply_ids)
            lps[name].append(got[name])
            follows[name] += sc.greedy_choice(prefix) == want
        real_placebo.append(got["real"] - got["placebo"])
        real_none.append(got["real"] - got["none"])
    n = len(rows)
    return {"checkpoint": checkpoint, "data": data, "rows": n, "paired": len(partner),
            "logp_per_token": {k: round(_mean(v), 4) for k, v in lps.items()},
            "real_minus_placebo": round(_mean(real_placebo), 4),
            "real_minus_placebo_ci": [round(x, 4) for x in _ci(real_placebo)],
            "real_minus_none": round(_mean(real_none), 4), "real_minus_none_ci": [round(x, 4) for x in _ci(real_none)],
            "greedy_follows_note": {k: round(v / n, 4) for k, v in follows.items()},
            "real_minus_placebo_by_row": [round(x, 6) for x in real_placebo]}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def note_kind(note: str) -> str:
    """The template coach's cue behind ``note`` (its first sentence), else ``other``."""
    from mimesis_lab.judges.coach import NOTES

    for name, text in NOTES.items():
        if note.startswith(text.split("{")[0].strip()[:30]):
            return name
    return "other"


def rollout_probe(checkpoint: str, rollouts: str, *, skip_gyms: tuple[str, ...] = ("tau", "function"),
                  limit: int = 300, seed: int = 0) -> dict[str, Any]:
    """The template coach's notes on RL rollouts (``models/agent_csd/rollouts.jsonl``): for up to ``limit``
    agent turns with a note (seeded draw), the mean log-prob per token of the agent's reply under the note
    minus under a placebo drawn from the other notes (CSD's gate argument), by gym, note kind and the reply's
    choice. A turn's coach input is as in the CSD job: the reasoning behind the user's previous reply and the
    user's reply to this turn (an ``action`` turn is addressed to the user in these gyms)."""
    from collections import defaultdict

    from mimesis_lab.judges.coach import CoachInput, TemplateCoach

    coach, items = TemplateCoach(), []
    for line in Path(rollouts).read_text().splitlines():
        r = json.loads(line)
        gym = str(r["data_source"]).removeprefix("interact_")
        if gym in skip_gyms:
            continue
        msgs, priv, choices = r["messages"], r.get("privileged") or [], r.get("choices") or []
        before = 0
        for t, i in enumerate(k for k, m in enumerate(msgs) if m["role"] == "assistant"):
            choice = choices[t] if t < len(choices) else None
            z = priv[before - 1] if 0 < before <= len(priv) else ""
            x = ""
            if choice == "action" and i + 1 < len(msgs):
                x = msgs[i + 1]["content"].split("\nReward:")[0]
                before += 1
            res = coach.coach(CoachInput(msgs[:i], z or "", x, "", gym))
            if res.note:
                items.append((gym, [dict(m) for m in msgs[:i]], res.note, msgs[i]["content"], str(choice)))
    if not items:
        raise SystemExit(f"{rollouts}: no coached turn (no rollout of a coached gym, or the coach never wrote)")
    rng = random.Random(seed)
    rng.shuffle(items)
    items = items[:limit]
    notes = sorted({it[2] for it in items})
    sc = Scorer(checkpoint)
    by: dict[str, list[float]] = defaultdict(list)
    for gym, history, note, reply, choice in items:
        others = [n for n in notes if n != note]
        if not others:
            continue
        placebo = rng.choice(others)
        ids = sc.reply_ids(history, note, reply)
        d = sc.logp(sc.render(history, note), ids) - sc.logp(sc.render(history, placebo), ids)
        by[f"{gym}/{note_kind(note)}/{choice}"].append(d)
        by["all"].append(d)
    return {"checkpoint": checkpoint, "rollouts": rollouts, "turns": len(by["all"]),
            "real_minus_placebo": {k: {"n": len(v), "mean": round(_mean(v), 4)}
                                   for k, v in sorted(by.items(), key=lambda kv: -len(kv[1]))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--data", default="data/agent_sft/val.parquet")
    ap.add_argument("--rollouts", default=None, help="instead: the coach's notes on these RL rollouts "
                    "(models/agent_csd/rollouts.jsonl), real - placebo by gym, note kind and choice")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.rollouts:
        out = rollout_probe(a.checkpoint, a.rollouts, **({"limit": a.limit} if a.limit else {}))
    else:
        out = probe(a.checkpoint, a.data, limit=a.limit)
    print(json.dumps({k: v for k, v in out.items() if k != "real_minus_placebo_by_row"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
