"""Experiment runner and benchmark reporting (the only place besides the CLI that writes reports)."""
