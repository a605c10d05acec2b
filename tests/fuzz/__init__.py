"""Fuzz tests of the readers of untrusted inputs (payloads, heads, model directories)."""
