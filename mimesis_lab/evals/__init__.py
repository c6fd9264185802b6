"""Evaluation of simulators and agents (metrics are pure functions; I/O at the edges)."""
