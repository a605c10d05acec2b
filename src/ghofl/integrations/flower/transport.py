"""A :class:`~ghofl.secure.Transport` over a Flower ``Grid``.

One QUERY message per client per stage, pushed together and pulled every :data:`POLL_S` seconds
until every reply is in or the stage timeout passes (Flower's own ``send_and_receive`` waits 3 s
between pulls on the deployment engine, which a multi-stage protocol pays at every stage).

A client whose reply does not arrive within the stage timeout, carries a Flower error, cannot
be decoded (:mod:`~ghofl.integrations.flower.records` raises
:class:`~ghofl.errors.ProtocolError`) or is a refusal from the client, is a dropout for the
protocol; the reason is kept in :attr:`FlowerTransport.traffic` (``refused``) and
:attr:`FlowerTransport.problems`. Bytes are counted per client per stage as
:func:`ghofl.secure.messages.message_nbytes` does for the in-memory transport (message
content), and the clients' compute time comes back in each reply.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ghofl.errors import ConfigError, ProtocolError
from ghofl.integrations.flower import MESSAGE_TYPE
from ghofl.integrations.flower.records import message_from_record, message_to_record
from ghofl.integrations.flower.timing import TIMING_FIELDS
from ghofl.secure.messages import ClientMessage, ServerMessage, Stage, message_nbytes
from ghofl.secure.transport import StageTraffic

__all__ = ["CLIENT_INFO", "POLL_S", "FlowerTransport", "send_and_receive"]

#: Seconds between two pulls of a stage's replies (one small request to the SuperLink each).
POLL_S = 0.2

#: ConfigRecord a ClientApp adds to every reply: ``seconds`` (float, time to answer),
#: ``partition-id`` (int, -1 if unknown), when it refused the request, ``refused`` (str), and
#: with the run config key ``client-timings`` the timing fields of
#: :mod:`~ghofl.integrations.flower.timing` (floats).
CLIENT_INFO = "ghofl-client"

#: Whether this process has named a dropped timing field (:func:`_seconds`) on stderr.
_WARNED = [False]


class FlowerTransport:
    """Deliver protocol requests to Flower nodes.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    node_ids : mapping of str to int
        The Flower node id of each client id.
    timeout_s : float
        Seconds to wait for the replies of one stage.

    Attributes
    ----------
    traffic : dict of str to StageTraffic
        Per stage: bytes to and from each client, client seconds, refusals.
    problems : dict of str to str
        Clients whose reply was missing, an error or malformed, with the stage and reason.
    partitions : dict of str to int
        The ``partition-id`` each client reported (when it did).
    stage_seconds : dict of str to float
        Wall time of each stage's exchange (sending to the last reply or the timeout).
    server_seconds : dict of str to float
        Of each stage's wall time, the part the server spent working rather than waiting
        for replies: encoding the requests, decoding the replies, and what the caller did
        with each reply before asking for the next (e.g. checking a payload and adding it to
        the total).
    client_timings : dict of str to dict of str to dict of str to float
        Per stage, per client that sent them: the reply's timing fields
        (:data:`~ghofl.integrations.flower.timing.TIMING_FIELDS`, run config key
        ``client-timings``) and its ``seconds``; empty without them. Only finite seconds
        >= 0 are kept here and in ``traffic`` (a node's NaN, infinity or negative number is
        dropped, so ``results.json`` stays valid JSON).
    """

    def __init__(self, grid: Any, node_ids: Mapping[str, int], timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"the stage timeout must be > 0 seconds; got {timeout_s}")
        self.grid = grid
        self.node_ids = {str(c): int(n) for c, n in node_ids.items()}
        if len(set(self.node_ids.values())) != len(self.node_ids):
            raise ConfigError("two client ids map to the same Flower node")
        self._client_of = {n: c for c, n in self.node_ids.items()}
        self.timeout_s = float(timeout_s)
        self.traffic: dict[str, StageTraffic] = {}
        self.problems: dict[str, str] = {}
        self.partitions: dict[str, int] = {}
        self.stage_seconds: dict[str, float] = {}
        self.server_seconds: dict[str, float] = {}
        self.client_timings: dict[str, dict[str, dict[str, float]]] = {}

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        """Send every request of ``stage`` at once; yield the decoded replies."""
        from flwr.app import Message

        traffic = self.traffic.setdefault(stage, StageTraffic())
        t0 = time.perf_counter()
        encoded: dict[int, tuple[Any, int]] = {}  # a broadcast request is encoded once
        messages = []
        for client, request in requests.items():
            node = self.node_ids.get(client)
            if node is None:
                continue
            if id(request) not in encoded:
                encoded[id(request)] = (message_to_record(request), message_nbytes(request))
            record, size = encoded[id(request)]
            traffic.to_client[client] = size
            messages.append(Message(content=record, dst_node_id=node,
                                    message_type=MESSAGE_TYPE))
        pushed: list[str] = []
        t_wait = time.perf_counter()
        replies = send_and_receive(self.grid, messages, self.timeout_s, pushed=pushed)
        waited = time.perf_counter() - t_wait
        # Flower's own error replies (e.g. "node unavailable") come from the SuperLink: match
        # them by the message they answer
        dst_of = {mid: int(m.metadata.dst_node_id) for mid, m in zip(pushed, messages,
                                                                     strict=False)}
        answered: set[str] = set()
        for reply in replies:
            src = int(reply.metadata.src_node_id)
            found = self._client_of.get(src if src in self._client_of else dst_of.get(
                str(reply.metadata.reply_to_message_id), -1))
            if found is None or found in answered:
                continue
            client = found
            answered.add(client)
            if reply.has_error():
                err = reply.error
                self._problem(stage, client, f"Flower error {err.code}: {err.reason}")
                continue
            info = reply.content.get(CLIENT_INFO)
            if info is not None:
                secs = _seconds(info, "seconds", stage, client)
                if secs is not None:
                    traffic.client_seconds[client] = secs
                self._timings(stage, client, info)
                part = info.get("partition-id")
                if isinstance(part, int) and not isinstance(part, bool) and part >= 0:
                    self.partitions[client] = part
                refused = info.get("refused")
                if isinstance(refused, str) and refused:
                    traffic.refused[client] = refused
                    self._problem(stage, client, f"refused: {refused}")
                    continue
            try:
                msg = message_from_record(reply.content, ClientMessage)
            except ProtocolError as exc:
                traffic.refused[client] = f"malformed reply: {exc}"
                self._problem(stage, client, f"malformed reply: {exc}")
                continue
            assert isinstance(msg, ClientMessage)
            traffic.from_client[client] = message_nbytes(msg)
            yield client, msg
        for client in requests:
            if client in self.node_ids and client not in answered:
                self._problem(stage, client, f"no reply within {self.timeout_s:g} s")
        self.stage_seconds[stage] = time.perf_counter() - t0
        self.server_seconds[stage] = max(self.stage_seconds[stage] - waited, 0.0)

    def _timings(self, stage: str, client: str, info: Any) -> None:
        """Keep the timing fields of a reply's ``info`` record, if it has any."""
        got = {k: v for k in (*TIMING_FIELDS, "seconds")
               if (v := _seconds(info, k, stage, client, warn=k != "seconds")) is not None}
        if set(got) & set(TIMING_FIELDS):
            self.client_timings.setdefault(stage, {})[client] = got

    def _problem(self, stage: str, client: str, why: str) -> None:
        self.problems.setdefault(client, f"{stage}: {why}")


def _seconds(info: Any, key: str, stage: str, client: str, *, warn: bool = True
             ) -> float | None:
    """The reply field ``key`` of ``info`` as seconds: a finite number >= 0, else ``None``.

    A field present but something else (NaN, an infinity, a negative number, a non-number)
    is dropped; the first such field of the process is named once on stderr (the server's
    log). ``warn=False``: drop without a word (the field was seen already).
    """
    value = info.get(key)
    if value is None:
        return None
    if (isinstance(value, float | int) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):
        return float(value)
    if warn and not _WARNED[0]:
        _WARNED[0] = True
        print(f"ghofl: dropped the field {key!r} = {value!r} of {client}'s {stage} reply: not "
              "a finite number of seconds >= 0 (later such fields are dropped silently)",
              file=sys.stderr, flush=True)
    return None


def send_and_receive(grid: Any, messages: list[Any], timeout_s: float,
                     poll_s: float = POLL_S, *, pushed: list[str] | None = None) -> list[Any]:
    """Push ``messages`` and pull their replies every ``poll_s`` seconds.

    Until all are in or ``timeout_s`` has passed: Flower's ``Grid.send_and_receive``
    with a shorter pull interval.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Any grid with ``push_messages`` and ``pull_messages``.
    messages : list of flwr.app.Message
    timeout_s, poll_s : float
        The stage's deadline and the pause between two pulls, in seconds.
    pushed : list of str, optional
        Receives the ids of the pushed messages, in the order of ``messages``.

    Returns
    -------
    list of flwr.app.Message
        The replies that arrived, in arrival order.
    """
    ids = [str(m) for m in grid.push_messages(messages)]
    if pushed is not None:
        pushed.extend(ids)
    pending = set(ids)
    deadline = time.monotonic() + timeout_s
    replies: list[Any] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        time.sleep(min(poll_s, left))
    return replies
