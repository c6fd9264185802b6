"""DVC stage ``splits``: train/val/test per dataset with no user, conversation or ABCD
scenario in two splits (grouped across all datasets, seeded, fractions from params)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl

from mimesis_lab.config import Params, SplitsParams
from mimesis_lab.io import Quarantine, read_parquet
from mimesis_lab.splits import assign_splits, connected_groups
from stages.common import StageError, StageResult, main

STAGE = "splits"
KEY_COLUMNS = {"user_id": "user", "conversation_id": "conv", "scenario_key": "scenario"}


def _read(name: str, path: str) -> pl.DataFrame:
    return read_parquet(path, f"dataset {name!r}", required=("user_id", "conversation_id"),
                        hint="run its stage first")


def run_splits(cfg: SplitsParams) -> StageResult:
    quarantine = Quarantine()
    data: dict[str, pl.DataFrame] = {}
    keys: list[list[str]] = []
    owners: list[tuple[str, int]] = []
    rows_in = 0
    for name, path in cfg.datasets.items():
        df = _read(name, path)
        rows_in += df.height
        cols = [c for c in KEY_COLUMNS if c in df.columns]
        null_any = pl.any_horizontal([pl.col(c).is_null() for c in cols])
        bad = df.with_row_index("_r").filter(null_any)
        for r in bad.iter_rows(named=True):
            nulls = [c for c in cols if r[c] is None]
            quarantine.add(path, r["_r"] + 1, f"missing key: null {nulls}", str({c: r[c] for c in cols}))
        df = df.filter(~null_any)
        data[name] = df
        for i, row in enumerate(df.select(cols).iter_rows()):
            keys.append([f"{KEY_COLUMNS[c]}:{v}" for c, v in zip(cols, row)])
            owners.append((name, i))
    groups = connected_groups(keys)
    sizes = Counter(groups)
    per_stratum: dict[str, Counter] = {}
    for (name, _), g in zip(owners, groups):
        per_stratum.setdefault(g, Counter())[name] += 1
    split_of = assign_splits(per_stratum, cfg.fractions, cfg.seed)
    per_ds: dict[str, list[str]] = {n: [""] * d.height for n, d in data.items()}
    for (name, i), g in zip(owners, groups):
        per_ds[name][i] = split_of[g]
    outputs: dict[str, pl.DataFrame] = {}
    sizes_out: dict[str, dict[str, int]] = {}
    rows_out = 0
    for name, df in data.items():
        df = df.with_columns(pl.Series("split", per_ds[name], dtype=pl.Utf8))
        sizes_out[name] = {}
        for split in cfg.fractions:
            part = df.filter(pl.col("split") == split)
            outputs[str(Path(cfg.output_dir) / name / f"{split}.parquet")] = part
            sizes_out[name][split] = part.height
            rows_out += part.height
    check_no_leak(outputs)
    total = max(1, sum(sizes.values()))
    realised = Counter()
    for g, n in sizes.items():
        realised[split_of[g]] += n
    extra = {
        "sizes": sizes_out,
        "groups": len(sizes),
        "largest_group_rows": max(sizes.values(), default=0),
        "realised_fractions": {s: round(realised[s] / total, 4) for s in cfg.fractions},
    }
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=rows_out, quarantine=quarantine,
                       inputs=[Path(p) for p in cfg.datasets.values()], extra=extra)


def check_no_leak(outputs: dict[str, pl.DataFrame]) -> None:
    """Raise if any user, conversation or scenario key occurs in two splits (defence in depth)."""
    seen: dict[str, str] = {}
    for path, df in outputs.items():
        split = Path(path).stem
        for col, ns in KEY_COLUMNS.items():
            if col not in df.columns:
                continue
            for v in df.get_column(col).unique().to_list():
                k = f"{ns}:{v}"
                if seen.setdefault(k, split) != split:
                    raise StageError(f"leak: {k} is in splits {seen[k]!r} and {split!r} ({path})")


def build(params: Params) -> StageResult:
    return run_splits(params.splits)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.splits))
