"""How busy the machine is: what a timing benchmark checks before it measures.

A timing is only worth writing down when the benchmark had the machine to itself. Two signs of
a busy machine are measured here: the 1-minute load average (``os.getloadavg``) per core, and
the CPU the *other* processes use over a short sample window (from ``/proc/stat``, all the
machine's CPU time, less this process's own from ``/proc/self/stat``). A machine is busy when
the load average exceeds :data:`MAX_LOAD_PER_CORE` per core, or when the other processes use
more than :data:`MAX_OTHER_CORES` cores. :func:`ghofl.bench.harness.check_quiet` refuses to
measure on a busy machine unless told to.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_LOAD_PER_CORE", "MAX_OTHER_CORES", "MachineLoad", "machine_load",
           "other_processes_cores"]

#: The 1-minute load average per core above which the machine is busy.
MAX_LOAD_PER_CORE = 1.5
#: The cores the other processes may use, over the sample window, before the machine is busy.
MAX_OTHER_CORES = 0.5
#: Seconds over which the CPU of the other processes is sampled.
SAMPLE_SECONDS = 0.5

_PROC_STAT = Path("/proc/stat")
_PROC_SELF = Path("/proc/self/stat")


@dataclass(frozen=True)
class MachineLoad:
    """The load of the machine at one moment.

    Attributes
    ----------
    load_average : tuple of float, shape (3,)
        The 1-, 5- and 15-minute load averages.
    cores : int
        CPU cores of the machine.
    other_cores : float or None
        Cores used by processes other than this one over the sample window; ``None`` where
        it cannot be measured (no ``/proc``).
    """

    load_average: tuple[float, float, float]
    cores: int
    other_cores: float | None

    def busy_reasons(self) -> list[str]:
        """Why the machine is busy, one phrase per sign (empty when it is quiet)."""
        reasons = []
        if self.load_average[0] > MAX_LOAD_PER_CORE * self.cores:
            reasons.append(
                f"1-minute load average {self.load_average[0]:.2f} on {self.cores} cores, above "
                f"{MAX_LOAD_PER_CORE:g} per core"
            )
        if self.other_cores is not None and self.other_cores > MAX_OTHER_CORES:
            reasons.append(
                f"other processes use {self.other_cores:.2f} cores, above {MAX_OTHER_CORES:g}"
            )
        return reasons

    def to_dict(self) -> dict[str, Any]:
        """The JSON form recorded beside timings."""
        return {"load_average": [round(v, 2) for v in self.load_average], "cores": self.cores,
                "other_cores": None if self.other_cores is None else round(self.other_cores, 2)}


def machine_load(sample_seconds: float = SAMPLE_SECONDS) -> MachineLoad:
    """The load average now and the other processes' CPU over the next ``sample_seconds``."""
    one, five, fifteen = os.getloadavg()
    return MachineLoad((one, five, fifteen), os.cpu_count() or 1,
                       other_processes_cores(sample_seconds))


def other_processes_cores(sample_seconds: float = SAMPLE_SECONDS) -> float | None:
    """Cores the processes other than this one use over ``sample_seconds`` seconds.

    The busy time of every CPU (``/proc/stat``: all but idle and I/O wait) less this process's
    own CPU time (``/proc/self/stat``), over the window's total CPU time, times the cores.

    Returns
    -------
    float or None
        ``None`` where ``/proc`` cannot be read (e.g. not Linux).
    """
    try:
        busy0, total0 = _all_cpu()
        own0 = _own_cpu()
        time.sleep(sample_seconds)
        busy1, total1 = _all_cpu()
        own1 = _own_cpu()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    cores = os.cpu_count() or 1
    other = max(0, (busy1 - busy0) - (own1 - own0))
    return cores * other / (total1 - total0)


def _all_cpu() -> tuple[int, int]:
    """Busy and total clock ticks of all CPUs together (the ``cpu`` line of /proc/stat)."""
    fields = [int(v) for v in _PROC_STAT.read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _own_cpu() -> int:
    """User and system clock ticks of this process (fields 14 and 15 of /proc/self/stat)."""
    after = _PROC_SELF.read_text().rsplit(")", 1)[1].split()  # past the command name
    return int(after[11]) + int(after[12])
