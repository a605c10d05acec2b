"""Client side: frozen encoders (``ghofl.client.encoders``), embedding (``ghofl.client.embed``)
and the on-disk embedding cache (``ghofl.client.cache``)."""
