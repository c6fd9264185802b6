"""The LM head only where the loss reads it (``logits_to_keep``) vs the full projection, per training forward.

Three workloads, each timed as forward + backward, the two variants interleaved (kept, full, full, kept, …)
after one warm-up each, in this process (``torch`` threads as the jobs use them):

- *SFT*: ``forward_ce`` (:mod:`mimesis_lab.jobs.sft`, with the format unlikelihood term as the default
  profile trains) on the first ``--rows`` rows of the ``sft`` train split, one row per micro-batch (the
  default profile's micro-batch), the model at ``sft.init_from``;
- *induction*: :func:`mimesis_lab.models.induction_loss` on warm-up batches (batch 32, spans 8-40, gaps
  0-32), the tiny model built from the ``model`` section;
- *RL*: :func:`mimesis_lab.rl.policy.token_logprobs` + the PPO loss on agent trajectories from
  ``models/agent_grpo/rollouts.jsonl`` as the update sees them (prompt + turns, the agent's tokens needed),
  ``--rl-rows`` rows, micro-batches of ``agent_rl.micro_rows``.

The *full* variant is the same model behind a wrapper without ``logits_to_keep`` in its signature, which is
what every forward did before. Reported: median seconds per pass over the workload, the ratio full / kept,
the share of positions whose logits are needed, and the largest difference of the losses.

    python bench/bench_lm_head.py [--repeat 5] [--rows 64] [--rl-rows 32]

Needs the outputs of a ``dvc repro`` (tokenizer, splits, ``models/midtrain``/``models/sft``, agent rollouts).
Not a test: run on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Full(torch.nn.Module):
    """The model without ``logits_to_keep``: every position projected onto the vocabulary."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, **kw)


class Engine:
    """What the loss functions need of a DeepSpeed engine: a device and the forward."""

    def __init__(self, module):
        self.module, self.device = module, torch.device("cpu")

    def __call__(self, **kw):
        return self.module(**kw)

    def parameters(self):
        return self.module.parameters()


def _interleaved(work: dict, repeat: int) -> dict:
    names = list(work)
    for n in names:
        work[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for r in range(repeat):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            losses[n] = work[n]()
            times[n].append(time.perf_counter() - t)
    med = {n: statistics.median(t) for n, t in times.items()}
    return {"median_s": med, "runs_s": times, "full_over_kept": round(med["full"] / med["kept"], 3),
            "loss": losses, "loss_abs_diff": abs(losses["full"] - losses["kept"])}


def sft_workload(params, n_rows: int):
    from mimesis_lab.jobs.sft import forward_ce
    from mimesis_lab.models import load_model
    from mimesis_lab.packing import IGNORE_INDEX
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.data import load_rows

    cfg = params.sft
    tok = load_tokenizer(params.tokenizer.pretrained or params.tokenizer.output_dir)
    rows = load_rows(cfg.train, tok, cfg, train=True, batching="grouped")[0][:n_rows]
    model = load_model(cfg.init_from)
    model.train()
    close, opn = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("<think>")
    unlikely = (close, close, opn) if cfg.format_unlikelihood else None
    kept_share = sum(sum(lab != IGNORE_INDEX for lab in r.labels) for r in rows) / sum(len(r.labels) for r in rows)

    def run(engine) -> float:
        total = 0.0
        for r in rows:
            out = forward_ce(engine, [r], cfg.max_len, tok.pad_token_id, "padding", torch.float32, unlikely)
            loss = out[0] / out[1] + (cfg.format_unlikelihood * out[2] / out[1] if unlikely else 0.0)
            loss.backward()
            total += float(loss.detach())
        model.zero_grad(set_to_none=True)
        return total

    return {"kept": lambda: run(Engine(model)), "full": lambda: run(Engine(Full(model)))}, kept_share, len(rows)


def induction_workload(params, tokenizer_vocab: int, batches: int = 8):
    from mimesis_lab.models import build_tiny_model, induction_batch, induction_loss

    model = build_tiny_model(params.model, tokenizer_vocab, 0, 1)
    model.train()
    g = torch.Generator().manual_seed(0)
    data = [induction_batch(g, tokenizer_vocab, params.model.induction_warmup_batch,
                            max_gap=params.model.induction_warmup_max_gap) for _ in range(batches)]
    share = statistics.mean((seq.shape[1] - 1 - start) / seq.shape[1] for seq, start in data)

    def run(m) -> float:
        total = 0.0
        for seq, start in data:
            loss = induction_loss(m, seq, start)
            loss.backward()
            total += float(loss.detach())
        model.zero_grad(set_to_none=True)
        return total

    return {"kept": lambda: run(model), "full": lambda: run(Full(model))}, share, batches


def rl_workload(params, n_rows: int):
    from mimesis_lab.models import load_model
    from mimesis_lab.rl.losses import ppo_clip_loss
    from mimesis_lab.rl.policy import UpdateRow, pad_update_rows, token_logprobs
    from mimesis_lab.tokenizer import load_tokenizer

    from mimesis_lab.config import phase_params

    cfg = phase_params(params, "agent_grpo")
    path = Path(cfg.output_dir) / "rollouts.jsonl"
    tok = load_tokenizer(cfg.init_from)
    rows = []
    with path.open() as fh:
        for line in fh:
            tr = json.loads(line)
            msgs = tr.get("messages") or []
            if len(rows) >= n_rows or not msgs:
                continue
            ids, positions = [], []
            for m in msgs:          # the rendered trajectory: the agent's turns are the trained tokens
                piece = tok(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", add_special_tokens=False).input_ids
                if m["role"] == "assistant":
                    positions += list(range(len(ids) + 3, len(ids) + len(piece) - 1))
                ids += piece
            if not positions:
                continue
            n = len(positions)
            rows.append(UpdateRow(input_ids=tuple(ids), positions=tuple(positions), old_logp=(-1.0,) * n, adv=(0.5,) * n,
                                  group_id="g", rollout_id=str(len(rows))))
    if not rows:
        raise SystemExit(f"{path}: no trajectories with messages (run `dvc repro agent_grpo`)")
    model = load_model(cfg.init_from)
    model.train()
    share = sum(len(r.positions) for r in rows) / sum(len(r.input_ids) for r in rows)
    chunks = [rows[i:i + cfg.micro_rows] for i in range(0, len(rows), cfg.micro_rows)]

    def run(m, kept: bool) -> float:
        total = 0.0
        for chunk in chunks:
            b = pad_update_rows(chunk, tok.pad_token_id)
            logp = token_logprobs(m, b["input_ids"], b["attention_mask"], need=b["mask"] if kept else None)
            loss = ppo_clip_loss(logp, b["old_logp"], b["adv"], b["mask"], cfg.clip_eps)
            loss.backward()
            total += float(loss.detach())
        model.zero_grad(set_to_none=True)
        return total

    return {"kept": lambda: run(model, True), "full": lambda: run(Full(model), False)}, share, len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--rl-rows", type=int, default=32)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/lm_head.json")
    args = ap.parse_args(argv)
    from mimesis_lab.config import load_params
    from mimesis_lab.tokenizer import load_tokenizer

    os.chdir(ROOT)
    params = load_params(args.params)
    vocab = len(load_tokenizer(params.tokenizer.pretrained or params.tokenizer.output_dir))
    res = {"repeat": args.repeat, "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                              "python": platform.python_version(),
                                              "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}}
    for name, build in (("sft", lambda: sft_workload(params, args.rows)),
                        ("induction", lambda: induction_workload(params, vocab)),
                        ("rl", lambda: rl_workload(params, args.rl_rows))):
        work, share, n = build()
        r = res[name] = {"items": n, "needed_share": round(share, 3), **_interleaved(work, args.repeat)}
        print(f"{name:9s} ({n} items, logits needed at {share:.0%} of the positions): kept "
              f"{r['median_s']['kept']:.2f} s, full {r['median_s']['full']:.2f} s, full/kept {r['full_over_kept']:.2f}x"
              f" (|loss diff| {r['loss_abs_diff']:.2e})")
    res["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
