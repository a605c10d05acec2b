"""A client's ledger of the rounds its data entered.

Two rounds over the same data give the server two sums that differ by what changed between
them: a server that runs a second round without one client (or with one client's data
changed) learns that client's statistics by differencing the totals. A client therefore keeps
a ledger of the secure rounds its statistics were masked in, keyed by a digest of the
statistics (or, for evaluation rounds, of the held-out rows the vectors came from), and
refuses a second round over the same statistics or rows unless its user allows it explicitly.
Under differential privacy each entry also records the (ε, δ) the round spent, and
:meth:`RoundLedger.spent` composes them (basic composition: the sums, an upper bound).

The ledger is a small JSON file, rewritten atomically on every entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ghofl.data.cache_dir import safe_name
from ghofl.errors import ConfigError, ProtocolError
from ghofl.files import atomic_write
from ghofl.stats.client_stats import ClientStats

__all__ = ["LedgerEntry", "RoundLedger", "default_ledger_path", "stats_digest"]

_FORMAT = "ghofl-round-ledger"
_VERSION = 2  # 2 added the stage of an entry (1's entries are all masked inputs)
_READABLE = (1, 2)
_DATA_KEY = "data:"  # prefix of the ledger keys of vectors computed from held-out rows


def default_ledger_path(client_id: str) -> Path:
    """Where a client keeps its round ledger unless told otherwise.

    ``$GHOFL_STATE_DIR/ledgers/<id>.json``; without that variable the state directory is
    ``$XDG_STATE_HOME/ghofl`` (``~/.local/state/ghofl``). The file name is the client id made
    file-safe (:func:`~ghofl.data.cache_dir.safe_name`), so two ids never share a ledger.
    """
    root = os.environ.get("GHOFL_STATE_DIR")
    if not root:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        root = str(Path(xdg) / "ghofl")
    return Path(root) / "ledgers" / f"{safe_name(client_id)}.json"


def stats_digest(stats: ClientStats) -> str:
    """Hex SHA-256 of a client's statistics: canonical metadata and every array's bytes."""
    h = hashlib.sha256(json.dumps(stats.meta.to_dict(), sort_keys=True).encode())
    for name, arr in sorted(stats.arrays().items()):
        if arr is None:
            continue
        a = np.ascontiguousarray(arr)
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _repeated_what(digest: str) -> str:
    """What a ledger key stands for, in words: ``data:`` keys name held-out evaluation rows.

    Parameters
    ----------
    digest : str
        A ledger key: a :func:`stats_digest`, or ``data:<digest of the rows>``, the key of
        vectors computed from held-out rows
        (:meth:`~ghofl.secure.vectors.VectorPayload.ledger_key`).

    Returns
    -------
    str
        ``"held-out evaluation rows"`` or ``"statistics"``.
    """
    return "held-out evaluation rows" if digest.startswith(_DATA_KEY) else "statistics"


@dataclass(frozen=True)
class LedgerEntry:
    """One round a client's statistics entered.

    Attributes
    ----------
    digest : str
        :func:`stats_digest` of the statistics.
    round_id : str
        Hex round identifier.
    at : float
        UNIX time the masked input was sent.
    epsilon, delta : float
        The privacy the round spent (0 without DP).
    stage : {"advertised", "masked"}
        ``advertised``: the client took part in the round's first stage (its data not yet
        known: ``digest`` is empty); ``masked``: its masked input left the client.
    """

    digest: str
    round_id: str
    at: float
    epsilon: float = 0.0
    delta: float = 0.0
    stage: str = "masked"


class RoundLedger:
    """The rounds a client's statistics entered, kept in a JSON file.

    Parameters
    ----------
    path : str or os.PathLike
        The ledger file (created on the first entry).
    allow_repeat : bool, default False
        Let statistics enter more than one round (the user accepts that the server may
        difference the totals, or DP bounds what that reveals).
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_repeat: bool = False) -> None:
        self.path = Path(path)
        self.allow_repeat = allow_repeat

    def entries(self) -> list[LedgerEntry]:
        """Every recorded round, oldest first."""
        if not self.path.exists():
            return []
        try:
            body = json.loads(self.path.read_text())
            if body.get("format") != _FORMAT or body.get("version") not in _READABLE:
                raise ValueError(f"format {body.get('format')!r} version {body.get('version')!r}")
            return [LedgerEntry(**e) for e in body["entries"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"the round ledger {self.path} is unreadable ({exc}); it is what stops a "
                "second round over the same data, so it is never replaced silently: restore "
                "it, or move it away to start a new ledger"
            ) from exc

    def begin(self, round_id: bytes) -> None:
        """Record that this client joins round ``round_id``; refuse a round id seen before.

        A round id is used once, whatever the data and whether the earlier round finished or
        aborted: a server that reruns a round under the same id could difference the totals
        or replay what clients signed in it. A round that aborted before any share was
        revealed may be retried under a new id.

        Raises
        ------
        ProtocolError
            The round id is already in the ledger.
        """
        rid = round_id.hex()
        entries = self.entries()
        seen = [e for e in entries if e.round_id == rid]
        if seen:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seen[-1].at))
            raise ProtocolError(
                f"a round id already used (round {rid[:16]} began at {when}): a round id is "
                "never reused, since a server rerunning it could difference the totals or "
                "replay signatures; the server must start the round under a new id"
            )
        self._write([*entries, LedgerEntry("", rid, time.time(), stage="advertised")])

    def check(self, digest: str, round_id: bytes) -> None:
        """Refuse a round over statistics that already entered another round.

        ``digest`` is a :func:`stats_digest`, or ``data:<digest>`` for vectors computed
        from held-out evaluation rows; the refusal names which of the two was repeated
        (:func:`_repeated_what`).

        Raises
        ------
        ProtocolError
            The statistics (or rows) entered another round and repeats are not allowed.
        """
        if self.allow_repeat:
            return
        rid = round_id.hex()
        earlier = [e for e in self.entries()
                   if e.digest == digest and e.round_id != rid and e.stage == "masked"]
        if earlier:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(earlier[-1].at))
            raise ProtocolError(
                f"a second round over the same {_repeated_what(digest)} (they entered round "
                f"{earlier[-1].round_id[:16]} at {when}): the server could difference the two "
                "totals; allow repeated rounds explicitly to take part"
            )

    def record(self, digest: str, round_id: bytes, epsilon: float = 0.0,
               delta: float = 0.0) -> None:
        """Add the round (before the masked input leaves the client)."""
        entries = [e for e in self.entries() if e.round_id != round_id.hex()]
        entries.append(LedgerEntry(digest, round_id.hex(), time.time(), float(epsilon),
                                   float(delta)))
        self._write(entries)

    def _write(self, entries: list[LedgerEntry]) -> None:
        body = {"format": _FORMAT, "version": _VERSION,
                "entries": [e.__dict__ for e in entries]}
        text = json.dumps(body, indent=1) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))

    def spent(self, digest: str) -> tuple[float, float]:
        """(ε, δ) spent on these statistics over every recorded round (basic composition)."""
        mine = [e for e in self.entries() if e.digest == digest and e.stage == "masked"]
        return sum(e.epsilon for e in mine), sum(e.delta for e in mine)
