"""Experiment runner and benchmark reporting (with the CLI, the only code that writes reports)."""
