"""The DeepSpeed training loop, for real: CPU, gloo, ZeRO-2, the `deepspeed` and `torchrun`
launchers, a tiny Qwen3 and a tiny synthetic chat set (no mocks).

One module-scoped uninterrupted run (`run_a`, world size 1, deepspeed launcher, attached to
an MLflow run) is the reference that the other runs are compared with:
- world size 2 with the same global batch (micro 2 × accumulation 1 × 2 ranks vs 2 × 2 × 1);
- a run SIGKILLed (whole process group) after a checkpoint, then rerun with `resume: auto`;
- a run resumed from the reference's epoch-boundary checkpoint (explicit `resume: <path>`).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from mimesis_lab.config import load_params
from mimesis_lab.train.data import (DataError, DataPlan, batch_efficiency, batch_units, build_rows, eval_batches,
                                    read_conversations, resolve_batching)
from mimesis_lab.train.launch import LaunchError, build_command, free_port, job_env, launch
from mimesis_lab.train.checkpoint import MARKER, ResumeError, list_checkpoints, resolve_resume, tag_for, validate_checkpoint

ROOT = Path(__file__).resolve().parent.parent
ITEMS = ["apples", "pears", "books", "shoes", "tickets", "chairs", "lamps", "cups"]
N_TRAIN, GLOBAL_BATCH, EPOCHS = 16, 4, 50          # 4 steps per epoch, 200 steps
TOTAL = N_TRAIN * EPOCHS // GLOBAL_BATCH
ENV = {"OMP_NUM_THREADS": "1"}                       # 2 shared cores: one thread per rank


def _conv(rng: random.Random, i: int) -> list[dict[str, str]]:
    n, it = rng.randint(1, 9), ITEMS[i % len(ITEMS)]
    return [{"role": "assistant", "content": f"I need {n} {it}."},
            {"role": "user", "content": f"Here are {n} {it}."},
            {"role": "assistant", "content": f"Thanks, {n} {it} is all."}]


def _ds_config(path: Path, micro: int, gas: int) -> Path:
    path.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas, "gradient_clipping": 1.0,
        "fp16": {"enabled": False}, "bf16": {"enabled": False}, "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**9, "wall_clock_breakdown": False}))
    return path


class Project:
    """Tiny data, tokenizer and DeepSpeed configs in a tmp folder; writes params files."""

    def __init__(self, root: Path):
        from mimesis_lab.tokenizer import train_tokenizer

        self.root = root
        rng = random.Random(0)
        train = [_conv(rng, i) for i in range(N_TRAIN)]
        val = [_conv(rng, i) for i in range(N_TRAIN, N_TRAIN + 4)]
        # mixture copies: one conversation twice, one left out -> still N_TRAIN rows
        copies = [1] * N_TRAIN
        copies[3], copies[5] = 2, 0
        pl.DataFrame({"messages": train, "copies": copies}).write_parquet(root / "train.parquet")
        pl.DataFrame({"messages": val, "copies": [1] * 4}).write_parquet(root / "val.parquet")
        tok = train_tokenizer([m["content"] for c in train for m in c] * 4, vocab_size=300, min_frequency=2)
        tok.save_pretrained(str(root / "tokenizer"))
        self.ds1 = _ds_config(root / "ds_ws1.json", 2, 2)
        self.ds2 = _ds_config(root / "ds_ws2.json", 2, 1)

    def params(self, name: str, **train) -> Path:
        p = yaml.safe_load((ROOT / "params.yaml").read_text())
        p["tracking"]["enabled"] = False
        p["tokenizer"]["output_dir"] = str(self.root / "tokenizer")
        p["model"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                          induction_warmup_steps=0)   # the test profile: no warm-up (each world size would run its own)
        section = dict(p["midtrain"])
        section.update(train=str(self.root / "train.parquet"), val=str(self.root / "val.parquet"),
                       init_from="model", deepspeed_config=str(self.ds1), max_len=80, batching="padded",
                       epochs=float(EPOCHS), max_steps=None, lr=0.01, warmup_ratio=0.05, min_lr_ratio=0.1,
                       eval_every=20, save_every=20, keep_last=2, resume="auto", world_size=1,
                       launcher="deepspeed", seed=7, output_dir=str(self.root / name), log_every=1)
        section.update(train)
        p["midtrain"] = section
        path = self.root / f"params_{name}.yaml"
        path.write_text(yaml.safe_dump(p))
        load_params(path)  # validates
        return path

    def out(self, name: str) -> Path:
        return self.root / name


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    return Project(tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def run_a(project: Project):
    """The uninterrupted reference run: world size 1, deepspeed launcher, MLflow attached."""
    import mlflow

    uri = f"sqlite:///{project.root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("train-test", artifact_location=(project.root / "artifacts").as_uri())
    run_id = client.create_run(exp, run_name="midtrain").info.run_id
    t0 = time.time()
    res = launch("midtrain", project.params("a"), env={**ENV, "MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": uri},
                 echo=False, timeout_s=300)
    return {"out": project.out("a"), "result": res, "client": client, "run_id": run_id, "wall_s": time.time() - t0}


# ----------------------------------------------------------------------------- data (no DeepSpeed)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_job_dies_with_its_launcher():
    """A launcher killed by SIGKILL (a test timeout, an OOM kill) must not leave its job running in
    the job's own session: the job gets SIGTERM from the kernel."""
    code = (
        "import subprocess, sys, time\n"
        "from mimesis_lab.train.launch import _die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True,"
        " preexec_fn=_die_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            break
        if state in ("Z", "X"):  # dead, waiting for a reaper that may not exist in a container
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the job outlived its killed launcher")


def test_empty_or_missing_split_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.parquet"
    pl.DataFrame({"messages": []}, schema={"messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String}))}
                 ).write_parquet(empty)
    with pytest.raises(DataError, match=r"empty\.parquet: the split is empty"):
        read_conversations(empty, expand=True, seed=0)
    with pytest.raises(DataError, match=r"nope\.parquet: split file not found"):
        read_conversations(tmp_path / "nope.parquet", expand=False, seed=0)
    zero = tmp_path / "zero.parquet"
    pl.DataFrame({"messages": [[{"role": "assistant", "content": "hi"}]], "copies": [0]}).write_parquet(zero)
    with pytest.raises(DataError, match=r"zero\.parquet: the mixture `copies` are all 0"):
        read_conversations(zero, expand=True, seed=0)
    assert len(read_conversations(zero, expand=False, seed=0)) == 1      # validation: one per conversation
    nomsg = tmp_path / "nomsg.parquet"
    pl.DataFrame({"text": ["x"]}).write_parquet(nomsg)
    with pytest.raises(DataError, match=r"nomsg\.parquet: no `messages` column"):
        read_conversations(nomsg, expand=False, seed=0)


def test_mixture_expansion_and_rows(project: Project):
    convs = read_conversations(project.root / "train.parquet", expand=True, seed=7)
    assert len(convs) == N_TRAIN
    assert convs == read_conversations(project.root / "train.parquet", expand=True, seed=7)   # seeded
    plain = read_conversations(project.root / "train.parquet", expand=False, seed=7)
    assert sum(c == plain[3] for c in convs) == 2 and plain[5] not in convs
    from mimesis_lab.tokenizer import load_tokenizer

    tok = load_tokenizer(project.root / "tokenizer")
    rows, stats = build_rows(tok, convs, train_role="assistant", max_len=80, overlong="truncate", batching="padded",
                             source="train")
    packed, pstats = build_rows(tok, convs, train_role="assistant", max_len=160, overlong="truncate", batching="packed")
    assert stats["rows"] == N_TRAIN and stats["truncated"] == 0 and stats["tokenize_errors"] == 0
    _, wide = build_rows(tok, convs, train_role="assistant", max_len=160, overlong="truncate", batching="padded")
    assert pstats["rows"] <= N_TRAIN / 2 and pstats["packing_efficiency"] > 1.5 * wide["packing_efficiency"]
    assert pstats["target_tokens"] == stats["target_tokens"]
    _, short = build_rows(tok, convs, train_role="assistant", max_len=52, overlong="drop", batching="packed")
    assert short["dropped_overlong"] == N_TRAIN - short["examples_out"] > 0 and short["examples_out"] > 0
    with pytest.raises(DataError, match="train: no example is left"):
        build_rows(tok, convs, train_role="assistant", max_len=30, overlong="drop", batching="packed", source="train")


def test_grouped_units_cover_every_example_once_per_epoch(project: Project):
    from mimesis_lab.tokenizer import load_tokenizer

    tok = load_tokenizer(project.root / "tokenizer")
    convs = read_conversations(project.root / "train.parquet", expand=True, seed=7)
    rows, stats = build_rows(tok, convs, train_role="assistant", max_len=80, overlong="truncate", batching="grouped")
    assert stats["batching"] == "grouped" and all(len(r.seq_lens) == 1 for r in rows)   # one example per row
    units, per_micro = batch_units(rows, "grouped", 2, 80, seed=7)      # budget 2 x 80 padded tokens
    assert per_micro == 1 and 1 < len(units) < len(rows)
    assert all(len(u) * max(len(rows[i]) for i in u) <= 160 for u in units)
    plan = DataPlan(len(units), per_micro, 2, 1, seed=7)
    for epoch in range(3):                      # the plan's stream visits every unit, hence example, once
        seen = [i for u in plan.epoch_order(epoch) for i in units[u]]
        assert sorted(seen) == list(range(len(rows)))
    assert 0.5 < batch_efficiency(rows, units, "grouped", 80) <= 1.0
    assert batch_efficiency(rows, [[i] for i in range(len(rows))], "padded", 80) == pytest.approx(
        stats["packing_efficiency"])
    assert batch_units(rows, "packed", 2, 80, seed=7) == ([[i] for i in range(len(rows))], 2)
    assert [resolve_batching("auto", d) for d in ("cpu", "cuda")] == ["grouped", "packed"]
    assert resolve_batching("padded", "cuda") == "padded"
    with pytest.raises(ValueError, match="batching"):
        build_rows(tok, convs, train_role="assistant", max_len=80, overlong="truncate", batching="auto")


def test_packing_is_a_deprecated_alias_of_batching(project: Project):
    from mimesis_lab.config import ConfigError

    assert load_params(project.params("alias_f")).midtrain.batching == "padded"
    p = yaml.safe_load(project.params("alias_t").read_text())
    for value, mode in ((True, "packed"), (False, "padded")):
        del p["midtrain"]["batching"], p["sft_run"]["batching"]
        p["midtrain"]["packing"] = value
        path = project.root / "params_alias.yaml"
        path.write_text(yaml.safe_dump(p))
        assert load_params(path).midtrain.batching == mode
        p["midtrain"]["batching"] = "grouped"
        path.write_text(yaml.safe_dump(p))
        with pytest.raises(ConfigError, match="write only `batching`"):
            load_params(path)
        p["sft_run"]["batching"] = "auto"
        del p["midtrain"]["packing"]


def test_data_plan_is_world_size_independent():
    a = DataPlan(n_rows=10, micro_batch=2, grad_accum=2, world_size=1, seed=3)
    b = DataPlan(n_rows=10, micro_batch=2, grad_accum=1, world_size=2, seed=3)
    assert a.global_batch == b.global_batch == 4
    for step in range(12):
        assert a.step_rows(step) == b.step_rows(step)
        got = sorted(i for r in range(2) for mb in b.micro_batches(step, r) for i in mb)
        assert got == sorted(a.step_rows(step))
    # the stream visits every row once per epoch, in a new order each epoch
    stream = [i for s in range(5) for i in a.step_rows(s)]
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert stream[:10] != stream[10:20]
    assert a.total_steps(2.0) == 5 and a.total_steps(2.0, max_steps=3) == 3 and a.epoch_at(5) == 2.0
    assert eval_batches(5, 2, 2, 0) == [[0, 1], [4]] and eval_batches(5, 2, 2, 1) == [[2, 3], []]


def test_resume_path_errors(tmp_path):
    assert resolve_resume("never", tmp_path / "ck", 1) is None
    assert resolve_resume("auto", tmp_path / "ck", 1) is None                 # fresh start
    with pytest.raises(ResumeError, match="does not exist"):
        resolve_resume(str(tmp_path / "missing"), tmp_path / "ck", 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumeError, match="holds no complete checkpoint"):
        resolve_resume(str(tmp_path / "empty"), tmp_path / "ck", 1)
    half = tmp_path / "ck" / tag_for(20)
    half.mkdir(parents=True)
    (half / "mp_rank_00_model_states.pt").write_bytes(b"partial")             # killed while saving
    assert resolve_resume("auto", tmp_path / "ck", 1) is None
    with pytest.raises(ResumeError, match="incomplete"):
        resolve_resume(str(half), tmp_path / "ck", 1)


def test_deepspeed_is_imported_without_mlflow():
    """`dist_init` imports DeepSpeed with MLflow skipped (DeepSpeed imports it only for its autotuner, 1-2 s
    of every job's start); MLflow imports as usual afterwards (the metrics log's MLflow run)."""
    code = ("import sys\n"
            "from mimesis_lab.train.runtime import UNUSED_BY_DEEPSPEED, imports_skipped\n"
            "with imports_skipped(UNUSED_BY_DEEPSPEED):\n"
            "    import deepspeed\n"
            "assert 'deepspeed.autotuning' in sys.modules and 'mlflow' not in sys.modules, 'mlflow imported'\n"
            "import mlflow\n"
            "print(mlflow.__name__)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=job_env(1, ENV), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.split()[-1] == "mlflow", res.stderr[-3000:]


def test_launch_command_lines():
    ds = build_command("sft", "p.yaml", 2, "deepspeed", 29555)
    assert ds[-6:] == ["--module", "mimesis_lab.jobs.sft", "--phase", "sft", "--params", "p.yaml"]
    assert ds[ds.index("--num_gpus") + 1] == "2" and ds[ds.index("--num_nodes") + 1] == "1"
    assert ds[ds.index("--master_port") + 1] == "29555"
    tr = build_command("midtrain", "p.yaml", 2, "torchrun", 29556)
    assert tr[1:3] == ["-m", "torch.distributed.run"] and tr[tr.index("--nproc_per_node") + 1] == "2"
    assert tr[tr.index("-m", 3) + 1] == "mimesis_lab.jobs.sft"
    with pytest.raises(ValueError, match="unknown launcher"):
        build_command("sft", "p.yaml", 1, "mpirun", 1)
    assert build_command("agent_grpo", "p.yaml", 1, "direct", 1)[1:] == [
        "-m", "mimesis_lab.jobs.agent_grpo", "--phase", "agent_grpo", "--params", "p.yaml"]
    with pytest.raises(ValueError, match="world_size must be 1"):
        build_command("sft", "p.yaml", 2, "direct", 1)
    direct = job_env(1, {"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "1"}, "direct")   # never an outer job's
    assert (direct["RANK"], direct["WORLD_SIZE"], direct["LOCAL_RANK"]) == ("0", "1", "0")
    assert "MASTER_PORT" not in direct
    env = job_env(2, {"FOO": "1"})
    assert env["FOO"] == "1" and env["DS_ACCELERATOR"] == "cpu"          # no CUDA on this machine
    assert int(env["OMP_NUM_THREADS"]) == max(1, (os.cpu_count() or 1) // 2)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert job_env(1, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    # under torchrun the ranks pick the accelerator: the launching process does not import torch for it
    code = ("import os, sys\n"
            "os.environ.pop('DS_ACCELERATOR', None)\n"
            "from mimesis_lab.train.launch import job_env\n"
            "env = job_env(1, None, 'torchrun')\n"
            "print('DS_ACCELERATOR' in env, 'torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["False", "False"], res.stderr[-2000:]


# ----------------------------------------------------------------------------- the export, both ways
EXPORT_BOTH_WAYS = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mimesis_lab.config import load_params
from mimesis_lab.models import build_or_load
from mimesis_lab.tokenizer import load_tokenizer
from mimesis_lab.train.checkpoint import export_final, final_checkpoint, tag_for
from mimesis_lab.train.runtime import dist_init, load_ds_config, make_engine

params_path, tok_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
params = load_params(params_path)
rank, world = dist_init()
tok = load_tokenizer(tok_dir)
torch.manual_seed(0)
engine, _ = make_engine(build_or_load(params.model, tok), params.midtrain, load_ds_config(params.midtrain.deepspeed_config))
initial = {k: v.clone() for k, v in engine.module.state_dict().items()}
g = torch.Generator().manual_seed(rank)
for _ in range(3 * engine.gradient_accumulation_steps()):
    ids = torch.randint(0, len(tok), (engine.train_micro_batch_size_per_gpu(), 24), generator=g)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
assert not all(torch.equal(v, initial[k]) for k, v in engine.module.state_dict().items())
engine.save_checkpoint(str(out / "checkpoints"), tag=tag_for(3))
dist.barrier()
assert final_checkpoint(engine, out / "checkpoints", 3) is None       # ZeRO-2, fp32: from the engine
if rank == 0:
    export_final(engine, tok, None, out / "engine")
    export_final(engine, tok, out / "checkpoints" / tag_for(3), out / "zero_to_fp32")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=[pytest.mark.slow, pytest.mark.long])])
def test_export_from_the_engine_equals_zero_to_fp32(project: Project, tmp_path, world: int):
    """At ZeRO-2 in fp32 the engine's module holds the trained weights in full (every rank): the export
    written from it has the same bits as the one ``zero_to_fp32`` consolidates from a checkpoint."""
    from safetensors.torch import load_file

    ds = project.ds1 if world == 1 else project.ds2
    params = project.params(f"x{world}", deepspeed_config=str(ds), world_size=world)
    script = tmp_path / "export_both_ways.py"
    script.write_text(EXPORT_BOTH_WAYS)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(world),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), str(params),
           str(project.root / "tokenizer"), str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=job_env(world, ENV), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    a, b = load_file(str(out / "engine" / "model.safetensors")), load_file(str(out / "zero_to_fp32" / "model.safetensors"))
    assert a.keys() == b.keys() and a
    for k in a:
        assert a[k].dtype == b[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k
    assert json.loads((out / "engine" / "config.json").read_text()) == json.loads(
        (out / "zero_to_fp32" / "config.json").read_text())


# ----------------------------------------------------------------------------- real runs
def test_world_size_1_reduces_loss_and_exports(run_a, project: Project):
    out = run_a["out"]
    train = _records(out, "train")
    assert [r["step"] for r in train] == list(range(1, TOTAL + 1))
    first, last = sum(r["loss"] for r in train[:4]) / 4, sum(r["loss"] for r in train[-4:]) / 4
    assert last < 0.5 * first, (first, last)
    assert all(r["lr"] > 0 and r["grad_norm"] > 0 and r["tokens_per_s"] > 0 and r["step_time_s"] > 0 for r in train)
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["steps"] == TOTAL and summary["world_size"] == 1 and summary["zero_stage"] == 2
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert summary["tokens"] == sum(r["tokens"] for r in train)
    assert summary["examples_truncated"] == 0 and summary["examples_dropped"] == 0
    assert 0 < summary["packing_efficiency"] <= 1
    evals = _records(out, "eval")
    assert [e["step"] for e in evals] == list(range(0, TOTAL + 1, 20))
    # where the job's time went, from its process start (the fixed costs of a short run)
    phases = _records(out, "final")[-1]["phases_s"]
    assert {"startup", "dist_init", "engine", "eval", "steps", "checkpoint", "export"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and phases["steps"] > phases["export"]
    # checkpoints: keep_last = 2, each with its logged sha256
    kept = list_checkpoints(out / "checkpoints")
    assert [s for s, _ in kept] == [TOTAL - 20, TOTAL]
    ck = _records(out, "checkpoint")
    assert [c["step"] for c in ck] == list(range(20, TOTAL + 1, 20))
    from mimesis_lab.tracking import file_sha256

    for name, digest in ck[-1]["sha256"].items():
        assert file_sha256(Path(ck[-1]["path"]) / name) == digest
    # the exported folder is a plain Hugging Face model equal to the trained weights
    from mimesis_lab.models import load_model

    model = load_model(out / "final")
    sd = torch.load(kept[-1][1] / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    # MLflow (attached through MLFLOW_RUN_ID)
    client, run_id = run_a["client"], run_a["run_id"]
    assert len(client.get_metric_history(run_id, "train_loss")) == TOTAL
    for key in ("lr", "grad_norm", "tokens_per_s", "step_time_s", "val_loss"):
        assert client.get_metric_history(run_id, key), key
    assert client.get_run(run_id).data.tags["last_checkpoint"].endswith(tag_for(TOTAL))
    print(f"\nrun_a: {TOTAL} steps, wall {run_a['wall_s']:.1f}s, "
          f"median step {sorted(r['step_time_s'] for r in train)[TOTAL // 2] * 1e3:.1f} ms, "
          f"median {sorted(r['tokens_per_s'] for r in train)[TOTAL // 2]:.0f} tok/s")


def test_grouped_batching_trains(project: Project):
    """`batching: grouped` under real DeepSpeed (ZeRO-2, gradient accumulation 2): length groups of at
    most micro 2 x max_len 80 padded tokens, each micro-batch padded to its longest example; loss goes down."""
    params = project.params("g", batching="grouped", epochs=30.0, eval_every=1000, save_every=1000,
                            launcher="torchrun")
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)
    out = project.out("g")
    start = _records(out, "start")[0]
    assert start["batching"] == "grouped" and 1 < start["train_units"] < N_TRAIN and start["global_batch"] == 2
    train = _records(out, "train")
    assert len(train) == 15 * start["train_units"]
    first, last = sum(r["loss"] for r in train[:4]) / 4, sum(r["loss"] for r in train[-4:]) / 4
    assert last < 0.5 * first, (first, last)
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["batching"] == "grouped" and summary["final_val_loss"] < summary["initial_val_loss"]
    assert 0.5 < summary["batch_efficiency"] <= 1
    # every example once per epoch (30 x units is a whole number of steps): 30 x the training set's tokens
    from mimesis_lab.tokenizer import load_tokenizer

    convs = read_conversations(project.root / "train.parquet", expand=True, seed=7)
    _, stats = build_rows(load_tokenizer(project.root / "tokenizer"), convs, train_role="assistant", max_len=80,
                          overlong="truncate", batching="grouped")
    assert summary["tokens"] == 30 * stats["real_tokens"]
    assert summary["target_tokens"] == 30 * stats["target_tokens"]


def _shm_buffers() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("deepspeed_allreduce_buffer_*")} if shm.is_dir() else set()


@pytest.mark.slow
@pytest.mark.long
def test_world_size_2_matches_world_size_1(project: Project):
    launch("midtrain", project.params("w1", induction_rehearsal=0.0), env=ENV, echo=False, timeout_s=300)
    params = project.params("w2", world_size=2, deepspeed_config=str(project.ds2), induction_rehearsal=0.0)
    before = _shm_buffers()
    res = launch("midtrain", params, env=ENV, echo=False, timeout_s=300, tail_lines=10_000)
    # rank 0 tokenised and wrote the cache, rank 1 read it (it warns where it had to tokenise itself)
    assert _records(project.out("w2"), "start")[0]["token_cache"] == {"train": "missing", "val": "missing"}
    assert "TokenCacheWarning" not in res.stdout
    # gloo does the collectives: DeepSpeed's shm op (minutes of JIT C++, a 69 MB /dev/shm file
    # left behind per job) is never built
    assert _shm_buffers() - before == set()
    a, b = _records(project.out("w1"), "train"), _records(project.out("w2"), "train")
    assert len(a) == len(b) == TOTAL
    # same global batch, same rows per step: only the float summation order differs
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4, abs=1e-5), ra["step"]
        assert rb["tokens"] == ra["tokens"]
    wa, wb = _weights(project.out("w1")), _weights(project.out("w2"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4
    assert json.loads((project.out("w2") / "final" / "training_summary.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_zero3_torchrun_world_size_2_matches(run_a, project: Project):
    """ZeRO-3 (partitioned parameters; export rebuilt from zero_to_fp32) under torchrun."""
    ds3 = project.root / "ds_zero3.json"
    cfg = json.loads(project.ds2.read_text())
    cfg["zero_optimization"] = {"stage": 3}
    ds3.write_text(json.dumps(cfg))
    params = project.params("z3", world_size=2, deepspeed_config=str(ds3), launcher="torchrun")
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)
    a, b = _records(run_a["out"], "train"), _records(project.out("z3"), "train")
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-3, abs=1e-4), ra["step"]
    summary = json.loads((project.out("z3") / "final" / "training_summary.json").read_text())
    assert summary["zero_stage"] == 3 and summary["world_size"] == 2
    wa, wb = _weights(run_a["out"]), _weights(project.out("z3"))
    assert wa.keys() == wb.keys()
    # rehearsal is on here: its batch is split over the ranks and ZeRO-3 reduces partitioned
    # gradients in another order, so float drift over the run is ~1e-3 (measured 1.09e-3)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 3e-3


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(run_a, project: Project):
    params = project.params("k")
    out = project.out("k")
    cmd = build_command("midtrain", params, 1, "deepspeed", free_port())
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env(1, ENV), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not (out / "checkpoints" / tag_for(20) / MARKER).is_file():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint within 240 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)          # the launcher and its ranks, mid-run
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "final").exists()
    killed_at = max(r["step"] for r in _records(out, "train"))
    assert killed_at < TOTAL
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)   # resume: auto
    start = _records(out, "start")[-1]
    assert start["resumed"] and 20 <= start["step"] <= killed_at
    train = _records(out, "train")
    assert [r["step"] for r in train] == list(range(1, TOTAL + 1))  # records of the killed tail dropped
    wa, wk = _weights(run_a["out"]), _weights(out)
    for k in wa:
        assert torch.equal(wa[k], wk[k]), k                          # bit-exact
    ref = {r["step"]: r["loss"] for r in _records(run_a["out"], "train")}
    assert all(r["loss"] == ref[r["step"]] for r in train)
    # the exported summary is a function of the run, not of when or where it ran: no wall time (it goes
    # to metrics.jsonl and MLflow), so the same weights give the same DVC hash of final/
    sa, sk = (json.loads((o / "final" / "training_summary.json").read_text()) for o in (run_a["out"], out))
    assert not [k for k in sa if "time" in k]
    assert {k: v for k, v in sa.items() if k != "checkpoint"} == {k: v for k, v in sk.items() if k != "checkpoint"}
    assert _records(out, "final")[-1]["wall_time_s"] > 0


def test_resume_at_epoch_boundary_trains_exactly_the_remaining_steps(run_a, project: Project):
    src = run_a["out"] / "checkpoints" / tag_for(TOTAL - 20)         # step 180 = end of epoch 45
    dst = project.out("e") / "checkpoints" / src.name
    shutil.copytree(src, dst)
    info = json.loads((dst / MARKER).read_text())
    assert info["client_state"]["epoch"] == (TOTAL - 20) * GLOBAL_BATCH / N_TRAIN == 45.0
    params = project.params("e", resume=str(dst), launcher="torchrun")
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)
    out = project.out("e")
    train = _records(out, "train")
    assert [r["step"] for r in train] == list(range(TOTAL - 19, TOTAL + 1))   # exactly the 20 remaining
    assert train[0]["epoch"] == 45.25 and train[-1]["epoch"] == EPOCHS
    ref = {r["step"]: r["loss"] for r in _records(run_a["out"], "train")}
    assert all(r["loss"] == ref[r["step"]] for r in train)
    wa, we = _weights(run_a["out"]), _weights(out)
    assert all(torch.equal(wa[k], we[k]) for k in wa)
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["steps"] == TOTAL and summary["tokens"] == json.loads(
        (run_a["out"] / "final" / "training_summary.json").read_text())["tokens"]


@pytest.mark.long
def test_a_finished_run_off_the_save_cadence_resumes_from_its_last_checkpoint(project: Project):
    """ZeRO-2 in fp32: the export is written from the engine, so the last step gets no checkpoint of its own
    off the `save_every` cadence (5 steps, save_every 2: checkpoints 2 and 4). `resume: auto` of the finished
    run trains step 5 again from step 4 and exports the same bits. `initial_eval: false`: no step-0 evaluation."""
    params = project.params("o", max_steps=5, save_every=2, eval_every=1000, initial_eval=False, launcher="torchrun")
    out = project.out("o")
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)
    assert [s for s, _ in list_checkpoints(out / "checkpoints", complete_only=False)] == [2, 4]
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["steps"] == 5 and summary["checkpoint"] is None
    assert summary["initial_val_loss"] is None and [e["step"] for e in _records(out, "eval")] == [5]
    first = _weights(out)
    assert _records(out, "start")[-1]["token_cache"] == {"train": "missing", "val": "missing"}
    launch("midtrain", params, env=ENV, echo=False, timeout_s=300)          # resume: auto
    start = _records(out, "start")[-1]
    assert start["resumed"] and start["step"] == 4
    assert start["token_cache"] == {"train": "hit", "val": "hit"}           # the rerun tokenised nothing
    assert [r["step"] for r in _records(out, "train")] == [1, 2, 3, 4, 5]
    again = _weights(out)
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)


@pytest.mark.long
def test_a_direct_start_trains_the_same_bits_as_torchrun(project: Project):
    """`launcher: direct` (world size 1: the job module started without a launcher process) runs the same job,
    and so does a direct job started ahead (`prestart`: it imports, waits, then gets the rest of its
    environment, here a variable that appears only at launch, as MLFLOW_RUN_ID does in the flow)."""
    from mimesis_lab.train.launch import prestart

    outs = {}
    for name, launcher in (("dt", "torchrun"), ("dd", "direct"), ("dp", "prestarted")):
        params = project.params(name, max_steps=2, save_every=2, eval_every=1000, initial_eval=False,
                                launcher="direct" if launcher == "prestarted" else launcher)
        pending = prestart("midtrain", params, 1, "direct", ENV) if launcher == "prestarted" else None
        if pending is not None:
            time.sleep(1.0)                  # it is importing, before its go
            assert pending.proc.poll() is None
        res = launch("midtrain", params, env={**ENV, "MIMESIS_LATE_VAR": "x"} if pending else ENV, echo=False,
                     timeout_s=300, pending=pending, tail_lines=10_000)
        assert res.returncode == 0
        outs[launcher] = _weights(project.out(name))
    a = outs["torchrun"]
    for b in (outs["direct"], outs["prestarted"]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_prestarted_job_applies_its_late_environment_and_a_cancelled_one_never_runs(tmp_path):
    """The prestart runner: the go line sets and unsets variables before the job's main runs; an empty go
    (the flow failed before its launch) exits 0 without running the job; a job for other arguments is
    cancelled and started afresh."""
    from mimesis_lab.train.launch import PendingJob, prestart

    mod = tmp_path / "fake_job.py"
    mod.write_text("import os, sys\n"
                   "def main(argv=None):\n"
                   "    print('ran', argv, os.environ.get('LATE'), os.environ.get('GONE'))\n"
                   "    return 3 if argv == ['--fail'] else 0\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "GONE": "1"}
    cmd = [sys.executable, "-m", "mimesis_lab.train.prestart", "fake_job", "--x"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)    # as prestart starts it: cancel may signal its group
    job = PendingJob(proc, cmd, env, ("k",))
    job.go({**{k: v for k, v in env.items() if k != "GONE"}, "LATE": "yes"})
    assert proc.stdout.read().strip().splitlines()[-1] == "ran ['--x'] yes None" and proc.wait() == 0
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)    # as prestart starts it: cancel may signal its group
    PendingJob(proc, cmd, env, ("k",)).cancel()
    assert proc.returncode == 0 and proc.stdout.closed
    os.environ.pop("MIMESIS_JOB_PRESTART", None)
    assert prestart("midtrain", "p.yaml", 2, "torchrun") is None and prestart("midtrain", "p.yaml", 1, "deepspeed") is None


def test_resume_auto_starts_fresh_after_a_change_of_settings(run_a, project: Project):
    out = project.out("f")
    shutil.copytree(run_a["out"] / "checkpoints", out / "checkpoints")
    shutil.copy(run_a["out"] / "metrics.jsonl", out / "metrics.jsonl")
    params = project.params("f", lr=0.005, max_steps=4, launcher="torchrun", save_every=2, token_cache=False)
    res = launch("midtrain", params, env=ENV, echo=False, timeout_s=300, tail_lines=10_000)
    assert "fingerprint differs); starting fresh" in res.stdout
    assert [r["resumed"] for r in _records(out, "start")] == [False]
    # the cache off: nothing read or written, the folder (a DVC output) there all the same
    assert _records(out, "start")[0]["token_cache"] == {"train": "off", "val": "off"}
    assert [p.name for p in (out / "token_cache").iterdir()] == ["README.md"]
    assert [r["step"] for r in _records(out, "train")] == [1, 2, 3, 4]
    assert [s for s, _ in list_checkpoints(out / "checkpoints", complete_only=False)] == [2, 4]


def test_corrupt_or_foreign_checkpoint_is_a_clear_error(run_a, project: Project):
    src = run_a["out"] / "checkpoints" / tag_for(TOTAL)
    bad = project.out("c") / "checkpoints" / src.name
    shutil.copytree(src, bad)
    with pytest.raises(ResumeError, match="world_size 1, this run has world_size 2"):
        validate_checkpoint(bad, world_size=2)
    optim = next(bad.glob("zero_pp_rank_0_*optim_states.pt"))
    data = bytearray(optim.read_bytes())
    data[len(data) // 2] ^= 0xFF                                      # same size, flipped byte
    optim.write_bytes(bytes(data))
    with pytest.raises(ResumeError, match="sha256"):
        validate_checkpoint(bad, world_size=1)
    optim.write_bytes(bytes(data[:100]))                              # truncated
    with pytest.raises(ResumeError, match="corrupt checkpoint file .size"):
        validate_checkpoint(bad, world_size=1)
    # through the launcher: the job fails fast with the reason in the log tail
    params = project.params("c", resume=str(bad), launcher="torchrun")
    with pytest.raises(LaunchError) as err:
        launch("midtrain", params, env=ENV, echo=False, timeout_s=300)
    assert "ResumeError" in err.value.tail and str(optim) in err.value.tail
    assert "training job failed" in str(err.value)
    assert not (project.out("c") / "final").exists()


def test_kill_job_never_signals_the_callers_process_group():
    """A child that shares our process group (not started with ``start_new_session``) is signalled alone:
    ``killpg`` on its group would kill this test run with it (it once did: a prestart cancelled under load
    took CI's ``make test`` down with SIGTERM). A reaped child is not signalled (its pid may be reused)."""
    from mimesis_lab.train.launch import kill_job

    beside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpgid(child.pid) == os.getpgrp()
        kill_job(child, grace_s=5)
        assert child.returncode == -signal.SIGTERM
        assert beside.poll() is None          # the rest of our group is untouched (and so is this process)
        kill_job(child)                       # reaped: nothing is signalled, nothing raised
    finally:
        beside.kill()
        beside.wait()
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    kill_job(own, grace_s=5)
    assert own.returncode == -signal.SIGTERM


def test_induction_rehearsal_adds_the_copy_task_to_every_step(project: Project):
    """`induction_rehearsal: w` adds w x the induction-task loss (random spans repeated after a gap) to each
    optimizer step: it is logged per step, starts at the uniform-guess loss over the task's token range (the
    tokenizer's 300 ids, from 75 up: ln 225 = 5.42), and changes the weights against the same run without it
    (same data, seed and schedule), while the data loss still goes down. A resumed run draws the same
    rehearsal batches (the generator is seeded by step): the second half resumed equals the uninterrupted run."""
    import math

    kw = dict(induction_rehearsal=1.0, induction_rehearsal_batch=4, launcher="direct", epochs=5.0,
              eval_every=1000, save_every=10)
    launch("midtrain", project.params("r", **kw), env=ENV, echo=False, timeout_s=300)
    out = project.out("r")
    train = _records(out, "train")
    assert len(train) == 20 and all(math.isfinite(r["induction_loss"]) for r in train)
    assert abs(train[0]["induction_loss"] - math.log(300 - 75)) < 0.6, train[0]["induction_loss"]
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    launch("midtrain", project.params("r0", **{**kw, "induction_rehearsal": 0.0}), env=ENV, echo=False,
           timeout_s=300)
    plain = _records(project.out("r0"), "train")
    assert "induction_loss" not in plain[0]
    assert train[0]["loss"] == plain[0]["loss"] and train[5]["loss"] != plain[5]["loss"]  # same batch 1, then not
    # resume from step 10 of this run: steps 11..20 match bit for bit
    src = out / "checkpoints" / tag_for(10)
    dst = project.out("r2") / "checkpoints" / src.name
    shutil.copytree(src, dst)
    launch("midtrain", project.params("r2", **{**kw, "resume": str(dst)}), env=ENV, echo=False, timeout_s=300)
    again = _records(project.out("r2"), "train")
    assert [r["step"] for r in again] == list(range(11, 21))
    assert [(r["loss"], r["induction_loss"]) for r in again] == [(r["loss"], r["induction_loss"]) for r in train[10:]]
    wa, wb = _weights(out), _weights(project.out("r2"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
