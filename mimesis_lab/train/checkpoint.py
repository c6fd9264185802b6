"""Checkpoints with exact resume, the run fingerprint, and the Hugging Face export.

Layout: ``output_dir/checkpoints/step_<8-digit step>/`` (e.g. ``step_00000040``), written by
``engine.save_checkpoint`` with a ``client_state``; then rank 0 writes ``mimesis_checkpoint.json``
(size + sha256 of every file) *after* the post-save barrier. Only a folder with that marker
counts as complete (DeepSpeed writes its ``latest`` file before all ranks have finished
writing), so a run SIGKILLed mid-save resumes from the previous one.

``resume: auto`` continues only a checkpoint of the *same* run: its client state carries
:func:`run_fingerprint` (one rule for every phase: the phase section minus
:data:`OPERATIONAL_KEYS`, the DeepSpeed JSON, the input files and folders, and the source files the
job module imports, :func:`mimesis_lab.code_deps.code_identity` — the rule ``dvc.yaml``'s code deps
follow too). After a change of settings, data or code it starts fresh (a fresh start clears the
output folder's old checkpoints, metrics and export). An explicit ``resume: <path>`` always resumes.

The export (:func:`export_final`) writes the fp32 weights into ``output_dir/final`` (``save_pretrained`` +
tokenizer). Where the engine's module holds them in full (:func:`exports_from_engine`: ZeRO-1/2 trained in
fp32 — each rank holds every parameter, and the optimizer copies its fp32 master values back after every
step — or stage 0) they are the module's state dict and the export needs no checkpoint; otherwise (ZeRO-3,
bf16/fp16 master weights) ``zero_to_fp32`` consolidates them from the last step's checkpoint. The two
give the same bits where both apply (tested). So the jobs checkpoint the last step only where the export
reads it; the ``save_every`` cadence is what a later run can resume from.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from mimesis_lab.code_deps import code_identity
from mimesis_lab.tracking import file_sha256

__all__ = ["ResumeError", "CHECKPOINTS", "MARKER", "OPERATIONAL_KEYS", "tag_for", "list_checkpoints",
           "validate_checkpoint", "resolve_resume", "resume_point", "save_checkpoint", "load_resume_checkpoint",
           "drop_checkpoints_after", "clear_outputs", "checkpoint_at", "exports_from_engine", "final_checkpoint",
           "export_final", "file_identity", "run_fingerprint", "relative_path"]

CHECKPOINTS = "checkpoints"
MARKER = "mimesis_checkpoint.json"
TAG_PREFIX = "step_"
HASH_LIMIT = 1 << 30          # sha256-verify checkpoints up to 1 GiB on resume (sizes always)

#: Keys of a phase section that do not change what is trained (left out of the fingerprint).
#: ``steps`` (RL phases) is operational: raising it continues a finished run from its last checkpoint.
OPERATIONAL_KEYS = ("resume", "eval_every", "initial_eval", "save_every", "keep_last", "log_every", "launcher",
                    "output_dir", "save_rollouts", "steps", "token_cache")


class ResumeError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the path and the problem."""


def relative_path(path: str | Path) -> str:
    """``path`` relative to the working directory (the project root) when it lies under it, so
    metrics and logs stay portable; otherwise as given."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- folders
def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def _tag_step(path: Path) -> int | None:
    name = path.name
    if path.is_dir() and name.startswith(TAG_PREFIX) and name[len(TAG_PREFIX):].isdigit():
        return int(name[len(TAG_PREFIX):])
    return None


def list_checkpoints(root: str | Path, complete_only: bool = True) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = [(s, p) for p in root.iterdir() if (s := _tag_step(p)) is not None]
    if complete_only:
        out = [(s, p) for s, p in out if (p / MARKER).is_file()]
    return sorted(out)


def validate_checkpoint(tag_dir: str | Path, world_size: int) -> dict[str, Any]:
    """Check a checkpoint folder before DeepSpeed touches it; returns its marker.

    Raises :class:`ResumeError` when the folder or its marker is missing or unreadable, a
    listed file is missing or has another size (or sha256, up to 1 GiB in all), or it was
    written with another world size.
    """
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        raise ResumeError(f"{tag_dir}: checkpoint folder does not exist")
    marker = tag_dir / MARKER
    if not marker.is_file():
        raise ResumeError(f"{tag_dir}: incomplete or foreign checkpoint (no {MARKER}; the run that wrote it "
                          "was probably killed while saving)")
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        files = info["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ResumeError(f"{marker}: corrupt checkpoint marker ({e})") from None
    if info.get("world_size") != world_size:
        raise ResumeError(
            f"{tag_dir}: written with world_size {info.get('world_size')}, this run has world_size {world_size}. "
            "ZeRO checkpoints are tied to the world size: resume with the same world_size, or start a new run "
            "from the exported weights (init_from: <output_dir>/final).")
    verify_hash = sum(int(f["size"]) for f in files.values()) <= HASH_LIMIT
    for rel, f in files.items():
        p = tag_dir / rel
        if not p.is_file():
            raise ResumeError(f"{tag_dir}: checkpoint file {rel} is missing")
        if p.stat().st_size != int(f["size"]):
            raise ResumeError(f"{p}: corrupt checkpoint file (size {p.stat().st_size}, expected {f['size']})")
        if verify_hash and file_sha256(p) != f["sha256"]:
            raise ResumeError(f"{p}: corrupt checkpoint file (sha256 differs from {MARKER})")
    return info


def resolve_resume(resume: str, ckpt_root: str | Path, world_size: int) -> tuple[Path, str] | None:
    """Where to resume from: ``(checkpoints root, tag)`` or ``None`` (fresh start).

    ``never`` → None; ``auto`` → the newest *complete* checkpoint under ``ckpt_root`` (None if
    there is none); a path → that checkpoint folder, or the newest complete one in that
    checkpoints folder. A path that does not exist, is not a checkpoint, or fails
    :func:`validate_checkpoint` raises :class:`ResumeError`.
    """
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(ckpt_root)
        if not found:
            return None
        tag_dir = found[-1][1]
    else:
        path = Path(resume)
        if not path.exists():
            raise ResumeError(f"resume: {path} does not exist")
        if _tag_step(path) is not None or (path / MARKER).exists():
            tag_dir = path
        else:
            found = list_checkpoints(path)
            if not found:
                raise ResumeError(f"resume: {path} holds no complete checkpoint (expected <output_dir>/{CHECKPOINTS} "
                                  f"or one of its {TAG_PREFIX}<8-digit step> folders)")
            tag_dir = found[-1][1]
    validate_checkpoint(tag_dir, world_size)
    return tag_dir.parent, tag_dir.name


def resume_point(resume: str, ckpt_root: Path, world_size: int, fingerprint: str,
                 say: Callable[[str], None]) -> tuple[Path, str] | None:
    """:func:`resolve_resume`, then the fingerprint rule: ``auto`` drops a checkpoint of another run
    (other settings, data or code) and starts fresh; an explicit path resumes anyway, with a note."""
    found = resolve_resume(resume, ckpt_root, world_size)
    if found is None:
        return None
    stored = json.loads((found[0] / found[1] / MARKER).read_text())["client_state"].get("fingerprint")
    if stored == fingerprint:
        return found
    if resume == "auto":
        say(f"resume: auto: {found[0] / found[1]} belongs to a run with other settings, data or code "
            "(fingerprint differs); starting fresh")
        return None
    say(f"note: resuming from {found[0] / found[1]}, written with other settings, data or code")
    return found


def _write_marker(tag_dir: Path, step: int, world_size: int, client_state: dict[str, Any]) -> dict[str, Any]:
    files = {}
    for p in sorted(tag_dir.rglob("*")):
        if p.is_file() and p.name != MARKER:
            files[str(p.relative_to(tag_dir))] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
    info = {"step": step, "world_size": world_size, "files": files,
            "client_state": {k: v for k, v in client_state.items() if not k.startswith("rng_")}}
    tmp = tag_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(info, indent=1), encoding="utf-8")
    os.replace(tmp, tag_dir / MARKER)
    return info


def save_checkpoint(engine, ckpt_root: Path, step: int, client: dict[str, Any], log: Any, keep_last: int,
                    rank: int, world: int) -> None:
    """Save on every rank, then (rank 0) write the completeness marker, log it (``log.checkpoint``)
    and keep the last ``keep_last`` complete checkpoints."""
    import torch.distributed as dist

    engine.save_checkpoint(str(ckpt_root), tag=tag_for(step), client_state=client)
    dist.barrier()
    if rank == 0:
        tag_dir = ckpt_root / tag_for(step)
        info = _write_marker(tag_dir, step, world, client)
        log.checkpoint(step, tag_dir, info)
        for _, old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_resume_checkpoint(engine, root: Path, tag: str) -> dict[str, Any]:
    """Load ``root/tag`` (weights and optimizer state) into ``engine``; its client state.
    Raises :class:`ResumeError` naming the folder when DeepSpeed cannot load it."""
    try:
        path, client = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
    except Exception as e:
        raise ResumeError(f"{root / tag}: cannot load checkpoint ({type(e).__name__}: {e})") from e
    if path is None or client is None:
        raise ResumeError(f"{root / tag}: DeepSpeed found no loadable checkpoint there")
    return client


def drop_checkpoints_after(ckpt_root: Path, step: int) -> None:
    """Remove checkpoint folders past ``step`` (stale folders of the killed run being resumed)."""
    for s, p in list_checkpoints(ckpt_root, complete_only=False):
        if s > step:
            shutil.rmtree(p, ignore_errors=True)


def clear_outputs(out_dir: Path, ckpt_root: Path, files: tuple[str, ...]) -> int:
    """A fresh start owns the output folder: remove old checkpoints, ``final/`` and ``files``;
    returns how many checkpoint folders were removed."""
    stale = [p for _, p in list_checkpoints(ckpt_root, complete_only=False)]
    for p in stale + [out_dir / "final"]:
        shutil.rmtree(p, ignore_errors=True)
    for f in files:
        (out_dir / f).unlink(missing_ok=True)
    return len(stale)


def checkpoint_at(ckpt_root: Path, step: int) -> str | None:
    """The complete checkpoint of ``step`` (:func:`relative_path`), ``None`` where that step has none."""
    tag_dir = ckpt_root / tag_for(step)
    return relative_path(tag_dir) if (tag_dir / MARKER).is_file() else None


def exports_from_engine(engine) -> bool:
    """Whether :func:`export_final` takes the weights from ``engine.module`` (no checkpoint needed): ZeRO-1/2
    without bf16/fp16, where the module's parameters are the fp32 values the optimizer copies back after every
    step, all-gathered to every rank; and stage 0, whose module is what the optimizer steps (cast to fp32)."""
    stage = engine.zero_optimization_stage()
    return stage == 0 or (stage <= 2 and not (engine.bfloat16_enabled() or engine.fp16_enabled()))


def final_checkpoint(engine, ckpt_root: Path, step: int) -> Path | None:
    """The checkpoint :func:`export_final` reads for the weights after ``step``: ``None`` where the engine
    holds them (:func:`exports_from_engine`), else that step's folder."""
    return None if exports_from_engine(engine) else ckpt_root / tag_for(step)


def export_final(engine, tokenizer, checkpoint: Path | None, final: Path) -> None:
    """Rank 0: the plain fp32 weights as a Hugging Face folder ``final``: the engine's module when
    ``checkpoint`` is ``None`` (:func:`final_checkpoint`), else ``zero_to_fp32`` of that checkpoint folder."""
    from mimesis_lab.models import save_hf

    module = engine.module
    if checkpoint is not None:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint.parent), tag=checkpoint.name)
        model = type(module)(module.config)          # a plain CPU copy (ZeRO-3 params are partitioned)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
        if unexpected or [k for k in missing if k not in tied]:
            raise RuntimeError(f"zero_to_fp32 export does not match the model: missing {missing}, "
                               f"unexpected {unexpected}")
        if hasattr(model, "tie_weights"):
            model.tie_weights()
    else:
        model = module
    if final.exists():
        shutil.rmtree(final)
    save_hf(model.to(torch.float32), tokenizer, final)


# ----------------------------------------------------------------------------- the fingerprint
def file_identity(path: str | None) -> dict[str, Any] | None:
    """Size + sha256 (up to 1 GiB) of a file; of a model folder, its weights file."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
            if (p / name).is_file():
                return file_identity(str(p / name))
        return {"path": str(path), "missing": True}
    if not p.is_file():
        return {"path": str(path), "missing": True}
    size = p.stat().st_size
    return {"size": size, "sha256": file_sha256(p) if size <= HASH_LIMIT else None}


def run_fingerprint(phase: str, section: Any, ds_config: Mapping[str, Any], inputs: Mapping[str, str | None],
                    job_module: str, extra: Mapping[str, Any] | None = None) -> str:
    """sha256 of what determines a phase's trained weights — the one rule of every job:

    - the phase section (a pydantic model) minus :data:`OPERATIONAL_KEYS`;
    - the DeepSpeed JSON;
    - ``inputs``: name -> file or model folder (size + sha256 of the file / the folder's weights);
    - ``extra``: settings that live outside the section (e.g. the ``model`` section a tiny model is
      built from, an external user endpoint);
    - the code: :func:`mimesis_lab.code_deps.code_identity` of ``job_module``, i.e. the source files
      it imports — the same files ``dvc.yaml`` lists as the stage's code deps.
    """
    doc = {"phase": phase,
           "section": {k: v for k, v in section.model_dump().items() if k not in OPERATIONAL_KEYS},
           "ds_config": dict(ds_config), "inputs": {k: file_identity(v) for k, v in sorted(inputs.items())},
           "extra": dict(extra or {}), "code": code_identity(job_module)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
