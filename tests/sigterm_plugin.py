"""A pytest plugin: SIGTERM stops the run as Ctrl-C does, so fixtures still tear down.

By default SIGTERM kills pytest at once, and a fixture that started processes (a local Flower
deployment, a writer) never stops them: they outlive the run. With this plugin SIGTERM raises
:class:`KeyboardInterrupt` in the main thread; pytest then ends the session and its
``pytest_sessionfinish`` tears down every fixture still set up, which stops what they started.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping the run and tearing down fixtures")


def pytest_configure(config: pytest.Config) -> None:
    """Route SIGTERM to :func:`_interrupt` (main thread, default handler only)."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
