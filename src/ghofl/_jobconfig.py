"""Key checks shared by the flat configs of client and server jobs.

:class:`~ghofl.client.job.ClientJob` and :class:`~ghofl.server.job.ServerJob` share them
(one run config may carry both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ghofl.errors import ConfigError


def check_config_keys(config: Mapping[str, Any], known: Iterable[str], *, what: str,
                      required: str, example: str, strict: bool) -> None:
    """Raise :class:`ConfigError` when ``required`` is missing or (``strict``) a key is unknown.

    A key is unknown when not in ``known``; messages name ``what`` ("client job
    config") and the key.
    """
    names = sorted(known)
    if strict:
        unknown = sorted(k for k in config if k not in names)
        if unknown:
            raise ConfigError(
                f"{what} has the unknown key {unknown[0]!r}; known keys: {', '.join(names)}"
            )
    if required not in config:
        raise ConfigError(f"{what} has no key {required!r}; {example}")
