"""Has the simulator learnt to enact an instructed behaviour, or memorised which training prompts enact it?

The world draws, per behaviour-conditioned support conversation, whether the customer enacts the behaviour
(``world.enact_rate``); the customer's private reason says so on the turn where it starts ("they are slow, i
expect better"). For every enacted conversation of the ThoughtTrace train and validation splits this finds that
*enacting turn* (:func:`enacting_turns`: the first customer turn with a reason clause that no non-enacted support
conversation of the world ever has), gives the checkpoint the conversation's own prompt and public history up to
it, and measures

- ``nll``: the mean per-token NLL of the recorded turn (``<think>`` block and utterance);
- ``mode_rate``: the share of ``--k`` samples (sim_rl's temperature and top_p) whose think block starts the same
  enacting clause.

By behaviour and split. A simulator that learnt the instruction enacts on validation prompts about as often as on
training ones; one that memorised its training conversations enacts on those and much less elsewhere (and on the
behaviour tasks' prompts, which it has never seen: ``scripts/behavior_probe.py``).

    python scripts/enact_probe.py models/sft/final [--k 8] [--json out.json]

A diagnostic, not a test.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def clauses(reason: str) -> list[str]:
    """A reason's clauses (split on ``;`` and new lines), lower-cased, digits masked, spaces squeezed."""
    out = []
    for c in re.split(r"[;\n]", reason or ""):
        c = re.sub(r"\s+", " ", re.sub(r"\d", "#", c.lower())).strip(" .")
        if c:
            out.append(c)
    return out


def _customer_turns(messages: Iterable[Mapping[str, Any]], role: str) -> list[tuple[int, str]]:
    """``(message index, think text)`` of the simulator's (``role``) turns."""
    out = []
    for i, m in enumerate(messages):
        if m.get("role") == role:
            t = _THINK.search(m.get("content") or "")
            out.append((i, t.group(1) if t else ""))
    return out


def enacting_turns(convs: Iterable[Mapping[str, Any]], meta: Mapping[str, Mapping[str, Any]],
                   role: str = "assistant") -> list[dict[str, Any]]:
    """The enacting turn of each enacted support conversation in ``convs`` (``conversation_id``, ``split``,
    ``messages``). ``meta``: the world's ``thoughttrace_meta.jsonl`` rows by id (``domain``, ``behavior``,
    ``enacted``). The cooperative vocabulary is every reason clause of the non-enacted support conversations (the
    neutral ones and those drawn not to enact); the enacting turn is the first customer turn of an enacted one
    with a clause outside it, and ``clause`` is that clause. Enacted conversations without such a turn are left
    out (their behaviour shows only in the utterance)."""
    convs = list(convs)
    support = [(c, meta[c["conversation_id"]]) for c in convs
               if meta.get(c["conversation_id"], {}).get("domain") == "support"]
    coop = {cl for c, m in support if not m.get("enacted")
            for _, r in _customer_turns(c["messages"], role) for cl in clauses(r)}
    out = []
    for c, m in support:
        if not m.get("enacted") or m.get("behavior") in (None, "N"):
            continue
        for k, (i, r) in enumerate(_customer_turns(c["messages"], role)):
            new = [cl for cl in clauses(r) if cl not in coop]
            if new:
                out.append({"conversation_id": c["conversation_id"], "split": c.get("split"),
                            "behavior": m["behavior"], "message": i, "turn": k, "clause": new[0]})
                break
    return out


def probe(checkpoint: str, params_path: str = "params.yaml", *, k: int = 8, seed: int = 0) -> dict[str, Any]:
    import polars as pl
    import torch

    from mimesis_lab.chat import tokenize_chat
    from mimesis_lab.config import load_params
    from mimesis_lab.envs.output_format import public_text
    from mimesis_lab.models import load_model
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.data import _to_messages

    p = load_params(params_path)
    meta_path = Path(p.world.output_dir) / "world" / "thoughttrace_meta.jsonl"
    if not meta_path.is_file():
        raise SystemExit(f"{meta_path}: no world metadata (the probe needs the world's enacted flags)")
    meta = {(r := json.loads(line))["id"]: r for line in meta_path.open() if line.strip()}
    convs = []
    for split, path in (("train", p.sft.train), ("val", p.sft.val)):
        for r in pl.read_parquet(path).select("conversation_id", "messages").to_dicts():
            convs.append({"conversation_id": r["conversation_id"], "split": split,
                          "messages": _to_messages(r["messages"])})
    by_id = {c["conversation_id"]: c for c in convs}
    role = p.sft.train_role
    turns = enacting_turns(convs, meta, role=role)
    model, tok = load_model(checkpoint).eval(), load_tokenizer(checkpoint)
    temp, top_p = p.sim_rl.rollout.temperature, p.sim_rl.rollout.top_p
    torch.manual_seed(seed)
    cells: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for t in turns:
        msgs = by_id[t["conversation_id"]]["messages"]
        ctx = [dict(x, content=public_text(x["content"])) if x["role"] == role else dict(x)
               for x in msgs[:t["message"]]]
        ids, mask = tokenize_chat(tok, ctx + [dict(msgs[t["message"]])], role)
        start = max(i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1]))
        x = torch.tensor([ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
            tgt, m = x[0, 1:], torch.tensor(mask[1:], dtype=torch.bool)
            nll = float(-lp[torch.arange(len(tgt)), tgt][m].mean())
            out = model.generate(x[:, :start].repeat(k, 1), do_sample=True, temperature=temp, top_p=top_p,
                                 max_new_tokens=32, pad_token_id=tok.pad_token_id or 0)
        hits = 0
        for row in out[:, start:]:
            think = tok.decode(row, skip_special_tokens=False).split("</think>")[0].replace("<think>", "")
            first = clauses(think)[:1]
            hits += bool(first) and first[0].startswith(t["clause"][:24])
        cells[(t["split"], t["behavior"])].append((nll, hits / k))
    table = {}
    for split in ("train", "val"):
        rows = {b: v for (s, b), v in cells.items() if s == split}
        allv = [x for v in rows.values() for x in v]
        table[split] = {b: _cell(v) for b, v in sorted(rows.items(), key=lambda kv: int(kv[0][1:]))}
        if allv:
            table[split]["all"] = _cell(allv)
    return {"checkpoint": checkpoint, "k": k, "temperature": temp, "top_p": top_p, "turns": len(turns),
            "by_split": table}


def _cell(v: list[tuple[float, float]]) -> dict[str, Any]:
    return {"n": len(v), "nll": sum(a for a, _ in v) / len(v), "mode_rate": sum(h for _, h in v) / len(v)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--k", type=int, default=8, help="samples per enacting turn (default 8)")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    out = probe(a.checkpoint, a.params, k=a.k)
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
