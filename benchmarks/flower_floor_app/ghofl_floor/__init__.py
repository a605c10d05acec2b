"""Flower's per-message floor for ``benchmarks/bench_flower.py`` (no ghofl imports)."""
