"""Where a ClientApp message's time goes, measured on the node (run config key ``client-timings``).

With the run config key :data:`~ghofl.integrations.flower.TIMINGS_KEY` set to ``true``, each
reply of ghofl's ClientApp carries, in its ``ghofl-client`` ConfigRecord, the seconds of

* :data:`START` (``start-s``): from the ClientApp process's start to the handler being entered,
  less the :data:`IMPORTS` of the ClientApp module's loading within that span: Python's start,
  Flower's own imports, its pull of the message, context and app. Only on the first message a
  process handles (a fresh process per message on Flower's deployment engine), and only where
  the process's age is readable (Linux ``/proc``, at the clock tick's resolution, 0.01 s);
  absent otherwise;
* :data:`IMPORTS` (``import-s``): ghofl's imports on this message: the ClientApp module's
  loading (first message of a process only) and the ``import`` statements run inside the
  handler (the modules a stage loads on first use);
* :data:`DECODE` (``decode-s``): the request's record to the protocol message;
* :data:`WORK` (``work-s``): the rest of the handler: the plan, the node's identity, the
  statistics, masking, shares, the saved state;
* :data:`ENCODE` (``encode-s``): the reply to its record (the evaluation stage's model message
  is timed as work whole);

the last three less the imports inside them, so the five add up to the process's start to the
end of the handler. Every span is measured with :func:`time.perf_counter`, the process's age
with the kernel's boot-time clock. Without the key no field is added (the replies are those of
a run without timings). Imports a module makes through :func:`importlib.import_module` outside
an ``import`` statement count as work.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ghofl.errors import ConfigError

__all__ = ["DECODE", "ENCODE", "IMPORTS", "START", "TIMING_FIELDS", "WORK", "ImportClock",
           "MessageClock", "process_age", "timings_requested"]

START, IMPORTS, DECODE, WORK, ENCODE = "start-s", "import-s", "decode-s", "work-s", "encode-s"
#: The reply fields, in the order of a message's life.
TIMING_FIELDS = (START, IMPORTS, DECODE, WORK, ENCODE)

#: Whether this process has yet to handle its first message (then it reports :data:`START`).
_FRESH = [True]


def timings_requested(run_cfg: Mapping[str, Any], key: str) -> bool:
    """The run config's ``key`` (a boolean; absent: ``False``).

    Raises
    ------
    ConfigError
        The key holds something else than ``true`` or ``false``.
    """
    value = run_cfg.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"run config key {key!r} must be true or false; got {value!r}: fix "
                          "it in the run config (flwr run --run-config)")
    return value


def process_age(stat: Path = Path("/proc/self/stat"),
                uptime: Path = Path("/proc/uptime")) -> float | None:
    """Seconds since this process started, from Linux's ``/proc``; ``None`` where unreadable.

    The process's start (field 22 of ``stat``, clock ticks since boot) against the seconds
    since boot (``uptime``), both on the kernel's boot-time clock, to 0.01 s.
    """
    try:
        fields = stat.read_text().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22; fields[0] is field 3 (the state)
        since_boot = float(uptime.read_text().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(since_boot - ticks / hz, 0.0)


class _ThreadClocks(threading.local):
    """Per thread: its running :class:`ImportClock` objects and its depth of ``import`` calls."""

    def __init__(self) -> None:
        self.clocks: list[ImportClock] = []
        self.depth = 0


_THREAD = _ThreadClocks()
#: The ``builtins.__import__`` the wrapper calls (the one it found on installation).
_ORIGINAL: list[Any] = []
_INSTALL = threading.Lock()


def _timed_import(*args: Any, **kwargs: Any) -> Any:
    """``builtins.__import__``, timed for the calling thread's running clocks (if any)."""
    local = _THREAD
    if local.depth or not local.clocks:
        return _ORIGINAL[0](*args, **kwargs)
    local.depth += 1
    t0 = time.perf_counter()
    try:
        return _ORIGINAL[0](*args, **kwargs)
    finally:
        elapsed = time.perf_counter() - t0
        local.depth -= 1
        for clock in local.clocks:
            clock.seconds += elapsed
            clock.statements += 1


def _install() -> None:
    """Make :func:`_timed_import` ``builtins.__import__``, once per process (idempotent)."""
    with _INSTALL:
        if not _ORIGINAL:
            _ORIGINAL.append(builtins.__import__)
            builtins.__import__ = _timed_import


class ImportClock:
    """Seconds spent in ``import`` statements of one thread while it runs (a context manager).

    Counts the outermost statements only (a module's own imports are in its import's time).
    The first clock a process enters replaces ``builtins.__import__`` by one timed wrapper
    for the rest of the process; the wrapper reads the calling thread's running clocks, so
    entering and leaving a clock changes nothing process-wide and clocks of other threads,
    left in any order, see none of this thread's imports. A clock is entered by one thread at
    a time. Imports through a later replacement of ``builtins.__import__`` that bypasses the
    wrapper are not counted.

    Attributes
    ----------
    seconds : float
        Seconds in the thread's outermost ``import`` statements while the clock ran.
    statements : int
        How many such statements ran.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements = 0

    def __enter__(self) -> ImportClock:
        _install()
        _THREAD.clocks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        clocks = _THREAD.clocks
        for i in range(len(clocks) - 1, -1, -1):
            if clocks[i] is self:
                del clocks[i]
                break


class MessageClock:
    """The timings of one message (see the module docstring), started on entering the handler.

    Parameters
    ----------
    on : bool
        Measure (the run config asks for timings); off, :meth:`fields` is empty and nothing is
        read or wrapped.
    load_s : float
        Seconds the ClientApp module took to load (its imports), reported by the process's
        first message.
    t0 : float, optional
        :func:`time.perf_counter` at the handler's entry (default: now).
    """

    def __init__(self, on: bool, load_s: float, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        fresh, _FRESH[0] = _FRESH[0], False
        self.on = on
        self.load_s = load_s if fresh else 0.0
        age = process_age() if on and fresh else None
        self.age = None if age is None else age - (time.perf_counter() - self.t0)
        self.spans = {DECODE: 0.0, ENCODE: 0.0}
        self.imports = ImportClock()
        self.total: float | None = None

    @contextmanager
    def running(self) -> Iterator[MessageClock]:
        """Time the handler's body (its imports apart); :attr:`total` is its seconds."""
        try:
            if self.on:
                with self.imports:
                    yield self
            else:
                yield self
        finally:
            self.total = time.perf_counter() - self.t0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time :data:`DECODE` or :data:`ENCODE`, less the imports inside it."""
        t0, i0 = time.perf_counter(), self.imports.seconds
        try:
            yield
        finally:
            self.spans[name] += (time.perf_counter() - t0) - (self.imports.seconds - i0)

    def fields(self) -> dict[str, float]:
        """The reply's timing fields (empty when off); call after :meth:`running` ended."""
        if not self.on:
            return {}
        assert self.total is not None, "the handler's clock has not run"
        out: dict[str, float] = {}
        if self.age is not None:
            out[START] = max(self.age - self.load_s, 0.0)
        imports = self.imports.seconds
        out[IMPORTS] = self.load_s + imports
        out.update(self.spans)
        out[WORK] = max(self.total - imports - sum(self.spans.values()), 0.0)
        return {k: float(out[k]) for k in TIMING_FIELDS if k in out}
