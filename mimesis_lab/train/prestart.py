"""A ``direct`` job's interpreter started ahead of its launch: ``python -m mimesis_lab.train.prestart JOB ARGS…``.

It imports the job's recipe module ``JOB`` (torch, DeepSpeed, transformers, MLflow: about 3 s of every job on
2 cores) while the flow that launches it creates the phase's MLflow run, then waits for one JSON line on stdin,
``{"set": {...}, "unset": [...]}``: the rest of the job's environment (``MLFLOW_RUN_ID``, known only once the
run exists). It applies it and runs ``JOB.main(ARGS)``, exactly what ``python -m JOB ARGS`` runs. An empty line
or end of file cancels the job: the process exits 0 without running it.

Started and released by :func:`mimesis_lab.train.launch.prestart` / :func:`~mimesis_lab.train.launch.launch`;
``MIMESIS_JOB_PRESTART=0`` turns it off. Only variables that the job's imports do not read may come late: the
prestart process already has every other variable of :func:`~mimesis_lab.train.launch.job_env` (threads, rank,
offline switches); MLflow reads its ``MLFLOW_*`` variables when the job first logs.
"""
from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m mimesis_lab.train.prestart JOB_MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, args = argv[0], argv[1:]
    job = importlib.import_module(module)
    from mimesis_lab.train.runtime import default_ds_accelerator

    default_ds_accelerator()                  # as job_main does, before the DeepSpeed import below
    for name in ("deepspeed", "mlflow"):      # imported by the job later on; ahead of the go as well
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    line = sys.stdin.readline()
    if not line.strip():
        return 0                              # cancelled before its go
    go = json.loads(line)
    for key in go.get("unset", []):
        os.environ.pop(key, None)
    os.environ.update({str(k): str(v) for k, v in go.get("set", {}).items()})
    sys.stdin = open(os.devnull, encoding="utf-8")   # the go line was the last input
    sys.argv = [module, *args]
    return job.main(args)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
