"""The round ledger's refusal names what was repeated: statistics or held-out evaluation rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import ProtocolError
from ghofl.secure.ledger import RoundLedger, stats_digest
from ghofl.stats import compute_stats


def _ledger_with(tmp_path: Path, key: str) -> RoundLedger:
    ledger = RoundLedger(tmp_path / "ledger.json")
    ledger.begin(b"\x00" * 16)
    ledger.record(key, b"\x00" * 16)
    return ledger


def test_a_repeated_statistics_round_names_the_statistics(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    key = stats_digest(compute_stats(rng.random((6, 3)), np.arange(6) % 2, 2, mode="means"))
    ledger = _ledger_with(tmp_path, key)
    with pytest.raises(ProtocolError, match=r"a second round over the same statistics \(they "
                       r"entered round 0{16} at .*the server could difference the two totals"):
        ledger.check(key, b"\x01" * 16)
    ledger.check(key, b"\x00" * 16)  # the round it entered is not a repeat of itself


def test_a_repeated_evaluation_round_names_the_held_out_rows(tmp_path: Path) -> None:
    key = "data:" + "ab" * 32
    ledger = _ledger_with(tmp_path, key)
    with pytest.raises(ProtocolError, match=r"a second round over the same held-out evaluation "
                       r"rows \(they entered round 0{16} at "):
        ledger.check(key, b"\x01" * 16)
    # the refusal of a data key never speaks of statistics, nor the other way round
    with pytest.raises(ProtocolError) as info:
        ledger.check(key, b"\x02" * 16)
    assert "statistics" not in str(info.value)
    RoundLedger(ledger.path, allow_repeat=True).check(key, b"\x01" * 16)
