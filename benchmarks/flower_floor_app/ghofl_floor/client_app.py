"""ClientApp: answer every query with an empty reply, or with as many bytes as the run config's
``reply-bytes`` gives the request's stage (imports flwr and the standard library only).

With the run config key ``client-timings`` (``true``) each reply also carries a ConfigRecord
``timings``: ``start-s``, the seconds from this process's start to the handler being entered
(first message of a process, where Linux's ``/proc`` tells the process's age; absent
otherwise), and ``seconds``, the handler's own (:func:`time.perf_counter`): the columns ghofl's
ClientApp reports under the same key, so the floor reads beside them.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()

#: Name of the reply's timing record.
TIMINGS = "timings"
#: Whether this process has yet to handle its first message.
_FRESH = [True]


def reply_size(reply_bytes: str, stages: str, stage: str) -> int:
    """Bytes to send at ``stage``: the matching entry of the comma-separated ``reply_bytes``
    (one per name of ``stages``; empty: 0 at every stage)."""
    if not reply_bytes:
        return 0
    sizes = dict(zip(stages.split(","), (int(b) for b in reply_bytes.split(",")), strict=True))
    return sizes.get(stage, 0)


def process_age() -> float | None:
    """Seconds since this process started (``/proc/self/stat`` field 22 against
    ``/proc/uptime``, to 0.01 s); ``None`` where unreadable."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        since_boot = float(Path("/proc/uptime").read_text().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(since_boot - ticks / hz, 0.0)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Reply at once: empty, or ``reply-bytes`` random bytes (one raw array) for this stage."""
    t0 = time.perf_counter()
    fresh, _FRESH[0] = _FRESH[0], False
    cfg = context.run_config
    timed = cfg.get("client-timings") is True
    age = process_age() if timed and fresh else None
    if age is not None:
        age -= time.perf_counter() - t0  # the age at the handler's entry
    info = msg.content.get("floor")
    stage = str(info.get("stage", "")) if isinstance(info, ConfigRecord) else ""
    size = reply_size(str(cfg.get("reply-bytes", "")), str(cfg.get("stages", "")), stage)
    content = RecordDict()
    if size:
        data = random.Random(size).randbytes(size)  # incompressible, ~10 ms for 13 MB
        content["floor"] = ArrayRecord({"payload": Array(dtype="uint8", shape=(size,),
                                                         stype="raw", data=data)})
    if timed:
        seconds = time.perf_counter() - t0
        content[TIMINGS] = ConfigRecord({"seconds": seconds} if age is None
                                        else {"start-s": age, "seconds": seconds})
    return Message(content, reply_to=msg)
