"""ServerApp: wait for the nodes, then run each stage (one query per node, naming the stage;
pull every poll-s seconds until every reply is in) and write the seconds per stage to
``results.json``; with the run config key ``client-timings`` also each node's reply timings
(``client_timings``: stage -> node id -> seconds by field).

Stage seconds are measured as ghofl's ServerApp measures them: from pushing a stage's messages
to its last reply. ``results.json`` is written last and is the success marker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def _wait_for_nodes(grid: Grid, expected: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= expected or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)


def _timings(reply: Message) -> dict[str, float]:
    """The reply's ``timings`` record (run config ``client-timings``), as floats; {} if none."""
    rec = reply.content.get("timings") if not reply.has_error() else None
    if not isinstance(rec, ConfigRecord):
        return {}
    return {str(k): float(v) for k, v in rec.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _stage(grid: Grid, nodes: list[int], name: str, timeout_s: float, poll_s: float,
           timings: dict[str, dict[str, float]]) -> tuple[float, int]:
    """One stage: its seconds and replies; each node's reply timings go into ``timings``."""
    t0 = time.perf_counter()
    pending = set(grid.push_messages([
        Message(RecordDict({"floor": ConfigRecord({"stage": name})}), dst_node_id=n,
                message_type="query") for n in nodes]))
    deadline = time.monotonic() + timeout_s
    answered = 0
    while pending and time.monotonic() < deadline:
        got = list(grid.pull_messages(pending))
        answered += sum(not m.has_error() for m in got)
        timings.update({str(m.metadata.src_node_id): t for m in got if (t := _timings(m))})
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if pending:
            time.sleep(poll_s)
    return time.perf_counter() - t0, answered


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the stages named in the run config; write results.json."""
    cfg = context.run_config
    out = Path(str(cfg["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    nodes = _wait_for_nodes(grid, int(cfg["expected-nodes"]), float(cfg["wait-timeout-s"]))
    seconds: dict[str, float] = {}
    replies: dict[str, int] = {}
    timings: dict[str, dict[str, dict[str, float]]] = {}
    for name in str(cfg["stages"]).split(","):
        seconds[name], replies[name] = _stage(grid, nodes, name, float(cfg["stage-timeout-s"]),
                                              float(cfg["poll-s"]), timings.setdefault(name, {}))
    ok = all(r == len(nodes) for r in replies.values())
    result: dict[str, object] = {"status": "ok" if ok else "failed", "nodes": len(nodes),
                                 "stage_seconds": seconds, "replies": replies}
    if any(timings.values()):
        result["client_timings"] = timings
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out / "results.json")
