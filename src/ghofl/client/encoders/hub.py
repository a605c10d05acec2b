"""Weights from the Hugging Face hub: the local cache first, one clear line when they are missing.

The library encoders get their pretrained weights through ``huggingface_hub`` (``timm:``,
``open_clip:`` tags hosted on the hub, ``hf:`` hub ids). Without network, ``huggingface_hub``
retries every request five times with exponential backoff (about 23 s), logging two warnings a
try, before it fails with a message that does not name the fix. :func:`cache_first` instead:

1. runs the load with downloads off (the hub's offline mode, the local cache only) and the hub's
   log quieted to errors; cached weights load at once, with or without network;
2. when the weights are not cached (``LocalEntryNotFoundError`` / ``OfflineModeIsEnabled`` in the
   exception chain): with ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set, raises a
   :class:`~ghofl.errors.DataError` naming that variable; else one request to the hub endpoint
   checks that it answers, and if it does not, raises a ``DataError`` saying so;
3. otherwise runs the load again with downloads on (the hub's log still quieted to errors).

Other failures of the load (an unknown tag, a corrupt file) propagate unchanged. The offline mode
and the log level are process-wide settings of ``huggingface_hub``, restored on exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

from ghofl.errors import DataError

__all__ = ["cache_first", "hub_unreachable", "is_cache_miss", "offline_variable"]

T = TypeVar("T")
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = frozenset({"1", "true", "yes", "on"})
_PROBE_TIMEOUT_S = 10.0


def offline_variable() -> str | None:
    """The name of the variable that turns hub downloads off, or ``None`` when they are on.

    ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to a true value in the environment, or
    ``HF_HUB_OFFLINE`` when ``huggingface_hub`` was imported with it set.
    """
    for name in _OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return name
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return "HF_HUB_OFFLINE"
    return None


def is_cache_miss(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says a hub file is not cached."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def hub_unreachable(timeout: float = _PROBE_TIMEOUT_S) -> str | None:
    """``None`` when the hub endpoint answers one HEAD request; else the error, in one line."""
    import huggingface_hub
    from huggingface_hub import constants

    try:
        huggingface_hub.get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
    return None


@contextlib.contextmanager
def _hub_settings(offline: bool) -> Iterator[None]:
    """The hub's log quieted to errors, and its offline mode on when ``offline``; restored."""
    from huggingface_hub import constants

    log = logging.getLogger("huggingface_hub")
    level, was_offline = log.level, constants.HF_HUB_OFFLINE
    log.setLevel(logging.ERROR)
    if offline:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was_offline
        log.setLevel(level)


def cache_first(build: Callable[[bool], T], subject: str, fix: str, *,
                download: str = "") -> T:
    """``build(local_only)`` from the hub cache first, downloading only when needed and possible.

    Parameters
    ----------
    build : callable
        Loads the weights; called with ``True`` (cache only; the hub's offline mode is on) and,
        when they are not cached and the hub answers, again with ``False``.
    subject : str
        What is loaded, with its verb, e.g. ``"the pretrained weights of timm model 'resnet18'
        are"``; the messages go on with "not in the local cache".
    fix : str
        The other way, e.g. ``"give a local weights file: --encoder timm:resnet18@PATH"``.
    download : str
        A command that downloads them, added to the hint (e.g. ``"hf download ORG/NAME"``).

    Returns
    -------
    What ``build`` returns.

    Raises
    ------
    DataError
        Not cached, and downloads are off (the message names the variable) or the hub does not
        answer (the message gives the error).
    """
    if importlib.util.find_spec("huggingface_hub") is None:
        return build(False)
    try:
        with _hub_settings(offline=True):
            return build(True)
    except Exception as exc:
        if not is_cache_miss(exc):
            raise
        miss = exc
    from huggingface_hub import constants

    where = f"not in the local cache ({constants.HF_HUB_CACHE})"
    it = "them" if subject.endswith(" are") else "it"
    example = f"; e.g. {download}" if download else ""
    flag = offline_variable()
    if flag is not None:
        raise DataError(
            f"{subject} {where} and downloads are off ({flag}=1); download {it} once with network "
            f"(unset {flag}{example}), or {fix}") from miss
    down = hub_unreachable()
    if down is not None:
        raise DataError(
            f"{subject} {where} and the Hugging Face hub ({constants.ENDPOINT}) cannot be "
            f"reached ({down}); download {it} once with network{example}, or {fix}") from miss
    with _hub_settings(offline=False):
        return build(False)
