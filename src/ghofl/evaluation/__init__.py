"""Scoring fitted heads on labelled test embeddings.

``ghofl evaluate``, the simulator and the server job share :func:`evaluate_heads`.
"""

from ghofl.evaluation.metrics import HeadScore, evaluate_heads

__all__ = ["HeadScore", "evaluate_heads"]
