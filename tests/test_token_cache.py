"""The pre-tokenised cache of the SFT-style splits (``mimesis_lab/train/token_cache.py``): a cached split
gives the very rows tokenising gives; a change of tokenizer, data or settings rebuilds it; a damaged
file is rebuilt with a warning; at world size 2 only rank 0 tokenises."""
from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from mimesis_lab.train import token_cache
from mimesis_lab.train.checkpoint import OPERATIONAL_KEYS
from mimesis_lab.train.data import DataError, load_rows
from mimesis_lab.train.token_cache import (CACHE_DIR, TokenCacheWarning, cache_key, load_split_rows, read_rows,
                                           row_settings)

ITEMS = ["apples", "pears", "books", "shoes", "tickets", "chairs", "lamps", "cups"]


def _conv(rng: random.Random, i: int) -> list[dict[str, str]]:
    n, it = rng.randint(1, 9), ITEMS[i % len(ITEMS)]
    return [{"role": "user", "content": f"I need {n} {it}."},
            {"role": "assistant", "content": f"Here are {n} {it}."},
            {"role": "user", "content": f"Thanks, {n} {it} is all."},
            {"role": "assistant", "content": f"Glad to help with the {it}."}]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> SimpleNamespace:
    """A training split with mixture copies, a validation split and a tokenizer folder."""
    from mimesis_lab.tokenizer import load_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("token_cache")
    rng = random.Random(0)
    train = [_conv(rng, i) for i in range(24)]
    copies = [1] * 24
    copies[2], copies[4] = 3, 0
    pl.DataFrame({"messages": train, "copies": copies}).write_parquet(root / "train.parquet")
    pl.DataFrame({"messages": [_conv(rng, i) for i in range(6)]}).write_parquet(root / "val.parquet")
    train_tokenizer([m["content"] for c in train for m in c] * 4, vocab_size=300,
                    min_frequency=2).save_pretrained(str(root / "tokenizer"))
    return SimpleNamespace(root=root, tokenizer_dir=root / "tokenizer", tokenizer=load_tokenizer(root / "tokenizer"),
                           splits={"train": (str(root / "train.parquet"), True), "val": (str(root / "val.parquet"),
                                                                                          False)})


def _cfg(**kw) -> SimpleNamespace:
    base = dict(train_role="assistant", max_len=200, overlong="truncate", seed=7)
    return SimpleNamespace(**{**base, **kw})


def _load(project, out: Path, cfg=None, *, batching="packed", tokenizer=None, tokenizer_dir=None, **kw):
    return load_split_rows(project.splits, tokenizer or project.tokenizer, tokenizer_dir or project.tokenizer_dir,
                           cfg or _cfg(), batching=batching, cache_dir=out / CACHE_DIR, **kw)


def test_cached_rows_are_the_tokenised_rows(project, tmp_path):
    cfg = _cfg()
    fresh = {n: load_rows(p, project.tokenizer, cfg, train=t, batching="packed") for n, (p, t) in project.splits.items()}
    built, status = _load(project, tmp_path, cfg)
    assert status == {"train": "missing", "val": "missing"}
    assert sorted(p.name for p in (tmp_path / CACHE_DIR).iterdir()) == ["README.md", "train.parquet", "val.parquet"]
    read, status = _load(project, tmp_path, cfg)
    assert status == {"train": "hit", "val": "hit"}
    for name in project.splits:
        assert built[name] == fresh[name]          # (rows, stats): PackedRow compares field by field
        assert read[name] == fresh[name]
    # the mixture: conversation 2 three times, 4 left out -> 24 + 2 - 1 = 25 examples before packing
    assert read["train"][1]["examples_in"] == 25 and read["val"][1]["examples_in"] == 6


def test_grouped_rows_round_trip_too(project, tmp_path):
    cfg = _cfg(max_len=80, overlong="drop")          # 72..91 tokens: some dropped, one example per row
    fresh = load_rows(project.splits["train"][0], project.tokenizer, cfg, train=True, batching="grouped")
    assert fresh[1]["dropped_overlong"] > 0
    _load(project, tmp_path, cfg, batching="grouped")
    read, status = _load(project, tmp_path, cfg, batching="grouped")
    assert status["train"] == "hit" and read["train"] == fresh


def test_rows_from_an_already_loaded_table(project):
    path = project.splits["train"][0]
    table = pl.read_parquet(path)
    assert (load_rows(path, project.tokenizer, _cfg(), train=True, batching="packed", table=table)
            == load_rows(path, project.tokenizer, _cfg(), train=True, batching="packed"))
    assert (load_rows(path, project.tokenizer, _cfg(), train=True, batching="packed", table=table.to_arrow())
            == load_rows(path, project.tokenizer, _cfg(), train=True, batching="packed"))


@pytest.mark.parametrize("change", [dict(max_len=160), dict(train_role="user"), dict(overlong="drop"),
                                   dict(seed=8)])
def test_a_change_of_settings_rebuilds(project, tmp_path, change):
    _load(project, tmp_path)
    rows, status = _load(project, tmp_path, _cfg(**change))
    assert status["train"] == "stale"
    assert rows["train"] == load_rows(project.splits["train"][0], project.tokenizer, _cfg(**change), train=True,
                                      batching="packed")
    # the validation split is not mixture-expanded: the seed does not touch it
    assert status["val"] == ("hit" if change == dict(seed=8) else "stale")
    assert _load(project, tmp_path, _cfg(**change))[1] == {"train": "hit", "val": "hit"}


def test_a_change_of_batching_rebuilds(project, tmp_path):
    _load(project, tmp_path, batching="packed")
    assert _load(project, tmp_path, batching="padded")[1] == {"train": "stale", "val": "stale"}


def test_a_change_of_data_rebuilds_a_copy_does_not(project, tmp_path):
    splits = {"train": (str(tmp_path / "train.parquet"), True)}
    df = pl.read_parquet(project.splits["train"][0])
    df.write_parquet(splits["train"][0])
    cfg, cache = _cfg(), tmp_path / CACHE_DIR

    def load():
        return load_split_rows(splits, project.tokenizer, project.tokenizer_dir, cfg, batching="packed",
                               cache_dir=cache)

    assert load()[1] == {"train": "missing"}
    df.write_parquet(tmp_path / "moved.parquet")          # the same bytes under another name: the same data
    splits["train"] = (str(tmp_path / "moved.parquet"), True)
    assert load()[1] == {"train": "hit"}
    df.with_columns(pl.Series("copies", [1] * df.height)).write_parquet(splits["train"][0])
    rows, status = load()
    assert status == {"train": "stale"}
    assert rows["train"][1]["examples_in"] == 24            # the new copies are used, not the old rows


def test_a_change_of_tokenizer_rebuilds(project, tmp_path):
    import shutil

    from mimesis_lab.tokenizer import load_tokenizer

    _load(project, tmp_path)
    other = tmp_path / "tokenizer2"
    shutil.copytree(project.tokenizer_dir, other)
    assert _load(project, tmp_path, tokenizer=load_tokenizer(other), tokenizer_dir=other)[1]["train"] == "hit"
    # another chat template (a system line before every conversation is the kind of edit that matters)
    cfg_file = other / "tokenizer_config.json"
    conf = json.loads(cfg_file.read_text())
    template = project.tokenizer.chat_template
    (other / "chat_template.jinja").unlink(missing_ok=True)
    conf["chat_template"] = "{{ '<|im_start|>system\\nhi<|im_end|>\\n' }}" + template
    cfg_file.write_text(json.dumps(conf))
    tok2 = load_tokenizer(other)
    assert tok2.chat_template != template
    rows, status = _load(project, tmp_path, tokenizer=tok2, tokenizer_dir=other)
    assert status == {"train": "stale", "val": "stale"}
    assert rows["train"] == load_rows(project.splits["train"][0], tok2, _cfg(), train=True, batching="packed")


def test_the_key_names_each_input(project):
    path, _ = project.splits["train"]
    settings = row_settings(_cfg(), train=True, batching="packed")
    key = cache_key(project.tokenizer, project.tokenizer_dir, path, settings)
    assert key == cache_key(project.tokenizer, project.tokenizer_dir, path, settings)      # deterministic
    assert key != cache_key(project.tokenizer, project.tokenizer_dir, project.splits["val"][0], settings)
    assert key != cache_key(project.tokenizer, project.tokenizer_dir, path, {**settings, "max_len": 201})
    assert row_settings(_cfg(), train=False, batching="packed")["seed"] is None


def test_token_cache_is_operational():
    """Turning the cache on or off does not change the run's fingerprint (resume still works)."""
    assert "token_cache" in OPERATIONAL_KEYS


@pytest.mark.parametrize("damage, problem", [("truncate", "cannot read"), ("flip", "cannot read|sha256"),
                                             ("foreign", "not a token cache"), ("tokens", "do not match their sha256")])
def test_a_corrupt_cache_is_rebuilt_with_a_warning(project, tmp_path, damage, problem):
    good, _ = _load(project, tmp_path)
    path = tmp_path / CACHE_DIR / "train.parquet"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":                    # one byte of the first data page
        data[20] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "foreign":                 # a parquet that is not a token cache
        pl.DataFrame({"input_ids": [[1, 2]]}).write_parquet(path)
    else:                                     # a readable file, one token changed: the sha256 catches it
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        ids = table.column("input_ids").to_pylist()
        ids[0][1] += 1
        table = table.set_column(0, "input_ids", pa.array(ids, type=table.schema.field("input_ids").type))
        pq.write_table(table, path)           # the schema metadata (key, digest) is kept
    with pytest.warns(TokenCacheWarning, match=f"train.parquet: .*({problem})"):
        rows, status = _load(project, tmp_path)
    assert status == {"train": "corrupt", "val": "hit"}
    assert rows == good
    assert read_rows(path, cache_key(project.tokenizer, project.tokenizer_dir, project.splits["train"][0],
                                     row_settings(_cfg(), train=True, batching="packed")))[0] == good["train"][0]


def test_off_neither_reads_nor_writes_but_keeps_the_folder(project, tmp_path):
    rows, status = _load(project, tmp_path, enabled=False)
    assert status == {"train": "off", "val": "off"}
    assert [p.name for p in (tmp_path / CACHE_DIR).iterdir()] == ["README.md"]     # a DVC output: must exist
    assert rows["train"] == load_rows(project.splits["train"][0], project.tokenizer, _cfg(), train=True,
                                      batching="packed")


def _two_ranks(project, out: Path, splits=None) -> dict[int, object]:
    """Ranks 0 and 1 as threads meeting at a real barrier; rank -> (rows, status) or the exception."""
    barrier = threading.Barrier(2, timeout=60)
    result: dict[int, object] = {}

    def rank(r: int) -> None:
        try:
            result[r] = load_split_rows(splits or project.splits, project.tokenizer, project.tokenizer_dir, _cfg(),
                                        batching="packed", cache_dir=out / CACHE_DIR, rank=r, world=2,
                                        barrier=barrier.wait)
        except Exception as e:  # noqa: BLE001 - compared below
            result[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]     # rank 1 first: it must wait
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return result


def test_world_size_2_only_rank_0_tokenises(project, tmp_path, monkeypatch):
    calls: list[str] = []
    real = token_cache.load_rows

    def counting(path, *a, **kw):
        calls.append(threading.current_thread().name)
        return real(path, *a, **kw)

    monkeypatch.setattr(token_cache, "load_rows", counting)
    result = _two_ranks(project, tmp_path)
    assert len(calls) == 2 and len(set(calls)) == 1          # train and val, one thread
    (rows0, status0), (rows1, status1) = result[0], result[1]
    assert status0 == {"train": "missing", "val": "missing"} and status1 == {"train": "hit", "val": "hit"}
    assert rows0 == rows1
    calls.clear()
    assert _two_ranks(project, tmp_path)[0][1] == {"train": "hit", "val": "hit"} and calls == []


def test_world_size_2_a_bad_split_fails_every_rank_without_a_hang(project, tmp_path):
    splits = {"train": (str(tmp_path / "nope.parquet"), True)}
    result = _two_ranks(project, tmp_path, splits)
    assert isinstance(result[0], DataError) and isinstance(result[1], DataError)
    assert "nope.parquet" in str(result[0])
