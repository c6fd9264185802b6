"""Progress for long loops (training steps, rollouts, evaluation): a tqdm bar with rate and ETA when
attached to a terminal, quiet line-oriented progress otherwise (CI, DVC logs, a launched job whose
output is piped to its flow).

Every line names the phase and, when known, the MLflow run (``MLFLOW_RUN_ID``), e.g.::

    [agent_grpo run=3f2a9c1b] 12/40 (30%) 0.52 it/s ETA 0:00:54 reward/mean=0.125

``MIMESIS_PROGRESS=bar|lines|off`` overrides the automatic choice; ``lines`` prints at most one
line per ``every_s`` seconds (default 10; the first and last update always print).
"""
from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from typing import Any, Mapping, TextIO

__all__ = ["Progress", "progress_mode", "format_eta"]


def progress_mode(stream: TextIO | None = None) -> str:
    """``bar`` on a terminal, ``lines`` otherwise; ``MIMESIS_PROGRESS`` overrides."""
    forced = os.environ.get("MIMESIS_PROGRESS", "").strip().lower()
    if forced in ("bar", "lines", "off"):
        return forced
    stream = stream or sys.stderr
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):
        return "lines"


def format_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    return str(_dt.timedelta(seconds=int(round(seconds))))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class Progress:
    """``with Progress(total, phase) as p: ... p.update(n=1, **postfix)``."""

    def __init__(self, total: int | None, phase: str, *, unit: str = "it", initial: int = 0,
                 every_s: float = 10.0, stream: TextIO | None = None, mode: str | None = None,
                 enabled: bool = True):
        self.total, self.phase, self.unit = total, phase, unit
        self.n = self._start_n = initial
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.mode = (mode or progress_mode(self.stream)) if enabled else "off"
        self._t0 = time.perf_counter()
        self._last = -1e18
        run = os.environ.get("MLFLOW_RUN_ID", "")
        self.prefix = f"[{phase} run={run[:8]}]" if run else f"[{phase}]"
        self._bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=self.prefix, unit=unit, file=self.stream,
                             dynamic_ncols=True)

    # ------------------------------------------------------------------ numbers
    @property
    def rate(self) -> float | None:
        dt = time.perf_counter() - self._t0
        done = self.n - self._start_n
        return done / dt if dt > 0 and done > 0 else None

    @property
    def eta_s(self) -> float | None:
        r = self.rate
        if self.total is None or r is None:
            return None
        return max(0.0, (self.total - self.n) / r)

    def line(self, postfix: Mapping[str, Any] | None = None) -> str:
        """The line-oriented progress text (also used by callers that print their own lines)."""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        of = f"/{self.total}" if self.total is not None else ""
        r = self.rate
        rate = f" {r:.3g} {self.unit}/s" if r is not None else ""
        eta = f" ETA {format_eta(self.eta_s)}" if self.total is not None else ""
        post = "".join(f" {k}={_fmt(v)}" for k, v in (postfix or {}).items())
        return f"{self.prefix} {self.n}{of}{pct}{rate}{eta}{post}"

    # ------------------------------------------------------------------ updates
    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in postfix.items()}, refresh=False)
            return
        now = time.perf_counter()
        last = self.total is not None and self.n >= self.total
        if last or now - self._last >= self.every_s:
            self._last = now
            print(self.line(postfix), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
