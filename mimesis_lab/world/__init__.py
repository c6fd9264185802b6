"""A seeded synthetic world (placeholder docstring, replaced below)."""
