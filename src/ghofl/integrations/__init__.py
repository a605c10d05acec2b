"""Integrations of ghofl with federated-learning frameworks (optional extras).

Nothing here is imported by ``import ghofl``; each subpackage imports its framework itself.
"""
