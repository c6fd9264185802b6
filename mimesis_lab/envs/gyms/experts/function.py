"""FunctionGym expert: retrieve the test case, query the hidden function on it, answer its output.

The gym answers any four integers with the function's output, the test case's included, so the
output is observable: ``search test`` → ``action <the test case>`` → ``answer <the output>``. No
user is involved (FunctionGym has none). Exploring, it first probes one to three other inputs (a
baseline and one-variable changes, as the gym's prompt suggests), which costs turns but no reward.
"""
from __future__ import annotations

import re
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert

__all__ = ["FunctionExpert"]


class FunctionExpert(Expert):
    gym = "function"

    def policy(self) -> Generator[Action, str, None]:
        probes = [[1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [1, 1, 1, 2]]
        if self.explore is not None:
            for p in probes[:self.explore.randint(1, 3)]:
                yield ("action", " ".join(map(str, p)))
        obs = yield ("search", "test")
        case = re.search(r"test case is:\s*(-?\d+(?:\s+-?\d+){3})", obs)
        if case is None:
            return
        obs = yield ("action", case.group(1))
        out = re.search(r"output for .* is (-?[0-9.eE+-]+)\s*$", obs.strip().splitlines()[0])
        if out is None:
            return
        yield ("answer", out.group(1).rstrip("."))
