"""The public training toolkit every recipe in :mod:`mimesis_lab.jobs` builds on (imports neither
:mod:`mimesis_lab.rl` nor :mod:`mimesis_lab.jobs`).

- :mod:`.runtime` — process group (gloo on CPU), rank-0 printing, ``all_reduce``/``gather``, the
  DeepSpeed JSON, the engine with our own AdamW, the per-rank command-line entry point.
- :mod:`.checkpoint` — checkpoint folders with a completeness marker, exact resume, the ONE run
  fingerprint, the Hugging Face export (from the engine, or ``zero_to_fp32`` of a checkpoint).
- :mod:`.metrics_log` — ``metrics.jsonl`` + MLflow per step; window means for summaries.
- :mod:`.step_run` — the bookkeeping of a step-based (RL) job: resume, logs, checkpoint cadence, export.
- :mod:`.data` — split parquet → mixture expansion → chat tokenisation → fit/pack → a deterministic,
  world-size-independent data plan (which rows each rank sees at each step).
- :mod:`.token_cache` — the tokenised splits cached under ``<output_dir>/token_cache``, keyed by the tokenizer,
  the split files, the settings and the code: rank 0 builds it, the other ranks and later runs read it.
- :mod:`.schedule` — warm-up + cosine lr, a pure function of the step.
- :mod:`.launch` — builds and runs the ``deepspeed`` / ``torchrun`` command line of a phase.

What runs on CPU here (DeepSpeed, gloo, ZeRO stages, launchers): ``docs/cpu-notes.md``.
"""
