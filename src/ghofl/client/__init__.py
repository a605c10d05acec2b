"""Client side: frozen encoders, embedding and the on-disk embedding cache.

See ``ghofl.client.encoders``, ``ghofl.client.embed`` and ``ghofl.client.cache``.
"""
