"""Environments: simulator tasks (the ABCD realistic-behaviour task and other user-simulation
tasks, SPEC §2.3–2.4) and the agent gyms (SPEC §3.1).

- :mod:`.behavior` — the behaviour-task reward computed from the judge's four scores.
"""
