"""ClientApp: answer every query with an empty reply, or with as many bytes as the run config's
``reply-bytes`` gives the request's stage (imports flwr and the standard library only)."""

from __future__ import annotations

import random

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def reply_size(reply_bytes: str, stages: str, stage: str) -> int:
    """Bytes to send at ``stage``: the matching entry of the comma-separated ``reply_bytes``
    (one per name of ``stages``; empty: 0 at every stage)."""
    if not reply_bytes:
        return 0
    sizes = dict(zip(stages.split(","), (int(b) for b in reply_bytes.split(",")), strict=True))
    return sizes.get(stage, 0)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Reply at once: empty, or ``reply-bytes`` random bytes (one raw array) for this stage."""
    cfg = context.run_config
    info = msg.content.get("floor")
    stage = str(info.get("stage", "")) if isinstance(info, ConfigRecord) else ""
    size = reply_size(str(cfg.get("reply-bytes", "")), str(cfg.get("stages", "")), stage)
    if size == 0:
        return Message(RecordDict(), reply_to=msg)
    data = random.Random(size).randbytes(size)  # incompressible, ~10 ms for 13 MB
    rec = ArrayRecord({"payload": Array(dtype="uint8", shape=(size,), stype="raw", data=data)})
    return Message(RecordDict({"floor": rec}), reply_to=msg)
