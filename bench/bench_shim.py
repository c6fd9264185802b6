"""Privileged-shim overhead: concurrent episodes through the shim vs straight to the upstream.

The upstream is the scripted fake simulator of ``tests/test_shim.py`` (answers
``<think>secret …</think>reply …`` at once, so the numbers measure HTTP + proxy cost, not
generation). By default the fake upstream and the shim each run in their own process (as
deployed: ``python -m mimesis_lab.rollout.shim``) and the load generator — ``--workers``
threads, each driving whole episodes of ``--turns`` chat turns — runs here; ``--inprocess``
runs all three in this process (GIL-bound, a pessimistic number).

Three runs of the same chat requests: ``direct`` (to the upstream), ``shim`` (through the shim,
each episode deleted at its end) and ``shim+checks`` (also reads back and compares each
episode's ``/privileged`` buffer, then finishes it: 1.5 extra requests per episode, not
counted in req/s). Every shim response is checked (the utterance names its own episode and turn).

    python bench/bench_shim.py [--episodes 256] [--turns 4] [--workers 64] [--max-episodes 64] [--inprocess] [--out f.json]

Prints requests/s and p50/p95/p99 latency of the chat requests for both runs and the
overhead ratio (direct req/s ÷ shim req/s, chat-only runs).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_shim import FakeUpstream, run_load  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float = 30) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            if httpx.get(url, timeout=1, trust_env=False).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


def _summary(lat: list[float], wall: float) -> dict:
    q = statistics.quantiles(lat, n=100)
    return {"requests": len(lat), "seconds": round(wall, 3), "req_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(q[49] * 1e3, 2), "p95_ms": round(q[94] * 1e3, 2), "p99_ms": round(q[98] * 1e3, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--max-episodes", type=int, default=64)
    ap.add_argument("--inprocess", action="store_true")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    ap.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()

    if args.serve_fake is not None:
        FakeUpstream(args.serve_fake).start().thread.join()
        return 0

    procs: list[subprocess.Popen] = []
    shim_obj = up_obj = None
    try:
        if args.inprocess:
            from mimesis_lab.rollout.shim import PrivilegedShim

            up_obj = FakeUpstream().start()
            shim_obj = PrivilegedShim(up_obj.url, max_episodes=args.max_episodes).start()
            upstream, shim, auth = up_obj.url, shim_obj.url, shim_obj.auth_headers
        else:
            up_port, shim_port = _free_port(), _free_port()
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-fake", str(up_port)], env=env))
            upstream = f"http://127.0.0.1:{up_port}/v1"
            creds = Path(tempfile.mkdtemp(prefix="bench-shim-")) / "shim.json"
            procs.append(subprocess.Popen([sys.executable, "-m", "mimesis_lab.rollout.shim", "--upstream", upstream,
                                           "--port", str(shim_port), "--max-episodes", str(args.max_episodes),
                                           "--credentials", str(creds)], env=env, stderr=subprocess.DEVNULL))
            _wait(f"{upstream}/models")
            end = time.time() + 30                        # the shim writes its credentials once it serves
            while not (creds.is_file() and creds.read_text().endswith("\n")) and time.time() < end:
                time.sleep(0.1)
            info = json.loads(creds.read_text())          # the run namespace URL and the privileged token
            shim, auth = info["url"], {"Authorization": f"Bearer {info['token']}"}

        limits = httpx.Limits(max_connections=args.workers, max_keepalive_connections=args.workers)
        with httpx.Client(timeout=60, trust_env=False, limits=limits) as c:
            run_load(lambda ep: upstream, min(args.workers, 32), 1, args.workers, c)          # warm up
            lat_d, wall_d, _ = run_load(lambda ep: upstream, args.episodes, args.turns, args.workers, c)
            lat_c, wall_c, _ = run_load(lambda ep: f"{shim}/ep/{ep}/v1", args.episodes, args.turns, args.workers, c,
                                        tag="C", finish=lambda ep: c.delete(f"{shim}/ep/{ep}", headers=auth))
            lat_s, wall_s, fails = run_load(lambda ep: f"{shim}/ep/{ep}/v1", args.episodes, args.turns,
                                            args.workers, c, check_url=lambda ep: f"{shim}/ep/{ep}/privileged",
                                            check_headers=auth,
                                            finish=lambda ep: c.post(f"{shim}/ep/{ep}/finish", headers=auth))
            stats = c.get(f"{shim}/health").json()
        direct, chat_only, via = _summary(lat_d, wall_d), _summary(lat_c, wall_c), _summary(lat_s, wall_s)
        res = {"episodes": args.episodes, "turns": args.turns, "workers": args.workers,
               "mode": "inprocess" if args.inprocess else "processes", "cpus": os.cpu_count(),
               "direct": direct, "shim": chat_only, "shim_checked": via,
               "overhead_ratio": round(direct["req_per_s"] / chat_only["req_per_s"], 2),
               "failures": len(fails), "shim_stats": {k: stats[k] for k in ("requests", "turns", "upstream_errors",
                                                                              "live_episodes", "evictions")}}
        for name, r in (("direct      ", direct), ("shim        ", chat_only), ("shim+checks ", via)):
            print(f"{name}: {r['requests']} chat requests in {r['seconds']:.2f}s = {r['req_per_s']:.0f} req/s; "
                  f"p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms")
        print(f"overhead ratio (direct/shim req/s): {res['overhead_ratio']}; failures {len(fails)}; "
              f"shim stats {res['shim_stats']}")
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        return 1 if fails else 0
    finally:
        if shim_obj is not None:
            shim_obj.stop()
        if up_obj is not None:
            up_obj.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
