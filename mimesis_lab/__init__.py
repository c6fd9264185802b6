"""mimesis_lab: the ML library of the MIMESIS reference implementation (no Prefect imports).

Data transforms (chat, thoughttrace, behaviors, splits), training, rollouts, RL,
environments, judges and evaluation live here; see DESIGN.md for the layout.
"""
__version__ = "0.1.0"
