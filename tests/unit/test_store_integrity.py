"""A store whose parts disagree is never read from (issue 44), and rollback evidence.

Every command that reads a store runs one check (``ghofl.store.verify.check_store``): a store
whose ``settings`` and ``total`` rows come from an older copy, or whose rows fail their
digests, is refused by ``fit``, ``aggregate --store``, ``forget``, ``store show`` and
``store verify`` with one ``ghofl: error:`` line naming what disagrees and the repair, exit
status 2, before anything is fitted or added. ``store verify --repair`` mends it atomically,
every change prints the store's head digest, ``store verify --expect`` catches a rolled-back
copy, and a model fitted from a store records its head (manifest and card). The CLI runs in
process (``ghofl.cli.main.main``) for speed.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest

from ghofl.cli.main import main
from ghofl.errors import GhoflWarning, StoreError
from ghofl.model.card import CARD_FILE, model_card
from ghofl.model.directory import MANIFEST
from ghofl.server.files import payload_plan
from ghofl.server.run import FederationServer
from ghofl.stats import ClientStats, save_stats
from ghofl.store import AggregationStore, StoreHead, check_store, read_total
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db_module
from ghofl.store.repair import repair_store
from ghofl.store.verify import inspect_store
from tests.helpers_store import FaultyConnection as _FaultyConnection
from tests.helpers_store import same_stats as _same
from tests.helpers_store import store_payloads as _payloads

SPLICED = (r"failed its integrity check: its settings record 6 contributions \(head [0-9a-f]{12}…"
           r"\) but it holds 12 rows \(head [0-9a-f]{12}…\): the rows and the settings come "
           r"from different copies; its total sums another set of contributions than the 12 "
           r"rows it holds .*; repair it with 'ghofl store verify --repair .*s\.db'")


def _cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GhoflWarning)
        rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error(rc: int, err: str, pattern: str) -> None:
    """Exit status 2 and one ``ghofl: error:`` line matching ``pattern``; no traceback."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("ghofl: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("ghofl: error: "), err
    assert re.search(pattern, lines[0]), err


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, for 'the store is unchanged'."""
    con = sqlite3.connect(path)
    try:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("settings", "contributions", "total")}
    finally:
        con.close()


def _splice(path: Path, old: Path) -> None:
    """Replace the settings and total rows of ``path`` with those of the older copy ``old``."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("ATTACH ? AS old", (str(old),))
    for table in ("settings", "total"):
        con.execute(f"DELETE FROM main.{table}")
        con.execute(f"INSERT INTO main.{table} SELECT * FROM old.{table}")
    con.close()


@pytest.fixture(params=[5.0, None], ids=["fixed-point", "recompute"])
def clip(request: pytest.FixtureRequest) -> float | None:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def spliced(tmp_path: Path, clip: float | None) -> tuple[Path, list[ClientStats]]:
    """A store of 12 contributions whose settings and total rows come from its copy at 6."""
    items = _payloads(1, 12, clip)
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        for i, s in enumerate(items):
            store.add(f"c{i:02d}", s)
            if i == 5:
                shutil.copy(path, tmp_path / "at6.db")
    _splice(path, tmp_path / "at6.db")
    return path, items


def _corrupt_row(path: Path, client_id: str) -> None:
    """Change one value of a contribution row, as bit rot would, leaving its digest."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("UPDATE contributions SET n_clipped = n_clipped + 1 WHERE client_id = ?",
                (client_id,))
    con.close()


# ---------------------------------------------------------------------- refusal
@pytest.mark.parametrize("command", ["fit", "aggregate", "forget", "show", "verify"])
def test_a_store_spliced_from_two_copies_is_refused_by_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        spliced: tuple[Path, list[ClientStats]], clip: float | None, command: str) -> None:
    path, _ = spliced
    save_stats(_payloads(2, 1, clip)[0], tmp_path / "late.ghs")
    before = _dump(path)
    args: dict[str, tuple[str | Path, ...]] = {
        "fit": ("fit", path, "--heads", "nb,lda", "--out", tmp_path / "m"),
        "aggregate": ("aggregate", "--store", path, tmp_path / "late.ghs"),
        "forget": ("forget", "--store", path, "--client", "c00"),
        "show": ("store", "show", path),
        "verify": ("store", "verify", path),
    }
    rc, out, err = _cli(capsys, *args[command])
    _one_error(rc, err, SPLICED)
    assert _dump(path) == before  # nothing added, removed or rebuilt
    assert not (tmp_path / "m").exists()  # nothing fitted
    assert "added" not in out


@pytest.mark.parametrize("clip", [5.0])  # the fixed-point total is read as stored
def test_fit_from_the_spliced_store_would_have_used_the_older_total(
        spliced: tuple[Path, list[ClientStats]]) -> None:
    """What the check prevents: the total row alone holds 6 of the 12 contributions."""
    path, items = spliced
    with pytest.raises(StoreError, match=SPLICED):
        read_total(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GhoflWarning)
        with AggregationStore(path, create=False) as store:  # the library, unchecked
            stale = store.total()
    assert stale.n_samples == sum(s.n_samples for s in items[:6])


@pytest.mark.parametrize("command", ["fit", "aggregate", "forget", "show"])
def test_a_row_that_fails_its_digest_is_refused_before_anything_is_added(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clip: float | None,
        command: str) -> None:
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        for i, s in enumerate(_payloads(3, 4, clip)):
            store.add(f"c{i}", s)
    _corrupt_row(path, "c2")
    save_stats(_payloads(4, 1, clip)[0], tmp_path / "late.ghs")
    before = _dump(path)
    args: dict[str, tuple[str | Path, ...]] = {
        "fit": ("fit", path, "--heads", "nb", "--out", tmp_path / "m"),
        "aggregate": ("aggregate", "--store", path, tmp_path / "late.ghs"),
        "forget": ("forget", "--store", path, "--client", "c0"),
        "show": ("store", "show", path),
    }
    rc, _, err = _cli(capsys, *args[command])
    _one_error(rc, err, r"failed its integrity check: the contribution of client 'c2' does "
               r"not match its integrity digest \(corrupt\); repair it with 'ghofl store "
               r"verify --repair")
    assert _dump(path) == before and not (tmp_path / "m").exists()


def test_check_store_and_the_server_refuse_in_the_library_too(
        spliced: tuple[Path, list[ClientStats]], clip: float | None) -> None:
    path, items = spliced
    with AggregationStore(path, create=False) as store, pytest.raises(StoreError,
                                                                      match=SPLICED):
        check_store(store)
    meta = items[0].meta
    with pytest.raises(StoreError, match=SPLICED):  # ghofl aggregate, simulate, Flower
        FederationServer(payload_plan(meta, store=path), ["a"], meta)
    repair_store(path)
    server = FederationServer(payload_plan(meta, store=path), ["a"], meta)
    assert server.store_head is not None and server.store_head.count == 12


# ---------------------------------------------------------------------- repair
def test_repair_rebuilds_the_total_from_the_rows_and_verify_then_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        spliced: tuple[Path, list[ClientStats]]) -> None:
    path, items = spliced
    rc, out, err = _cli(capsys, "store", "verify", "--repair", path)
    assert rc == 0, err
    assert "dropped 0 contributions that failed their digests" in out
    assert re.search(r"repaired: total rebuilt from 12 contributions \(it had recorded 6, "
                     r"head [0-9a-f]{64}\); head [0-9a-f]{64} \(12 contributions\)", out), out
    assert re.search(r": ok \(.*\); head [0-9a-f]{64} \(12 contributions\)\n$", out), out
    with AggregationStore(tmp_path / "fresh.db") as fresh:
        for i, s in enumerate(items):
            fresh.add(f"c{i:02d}", s)
        expected = fresh.total()
    assert _same(read_total(path), expected)
    rc, out, _ = _cli(capsys, "store", "verify", "--repair", path)
    assert rc == 0 and "nothing to repair" in out


def test_repair_drops_and_lists_the_rows_that_fail_their_digests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clip: float | None) -> None:
    items = _payloads(5, 5, clip)
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        for i, s in enumerate(items):
            store.add(f"c{i}", s)
    _corrupt_row(path, "c1")
    _corrupt_row(path, "c3")
    rc, _, err = _cli(capsys, "store", "verify", path)
    _one_error(rc, err, r"the contribution of client 'c1' does not match its integrity "
               r"digest .*client 'c3'.*verify --repair")
    rc, out, err = _cli(capsys, "store", "verify", "--repair", path)
    assert rc == 0, err
    assert "dropped 2 contributions that failed their digests: 'c1', 'c3'" in out
    with AggregationStore(path, create=False) as store:
        assert [c.client_id for c in store.contributions()] == ["c0", "c2", "c4"]
        head = check_store(store)
        assert head == store.head and head.count == 3
    with AggregationStore(tmp_path / "fresh.db") as fresh:
        for i in (0, 2, 4):
            fresh.add(f"c{i}", items[i])
        assert _same(read_total(path), fresh.total())
    assert _cli(capsys, "store", "verify", path)[0] == 0


def test_a_repair_that_fails_at_any_statement_leaves_the_old_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clip: float | None) -> None:
    items = _payloads(6, 4, clip)
    base = tmp_path / "base.db"
    with AggregationStore(base) as store:
        for i, s in enumerate(items):
            store.add(f"c{i}", s)
            if i == 1:
                shutil.copy(base, tmp_path / "old.db")
    _splice(base, tmp_path / "old.db")
    _corrupt_row(base, "c0")
    original = _dump(base)
    path = tmp_path / "s.db"
    real = sqlite3.connect
    counter = [0]

    def connect(*args: Any, **kwargs: Any) -> Any:
        return _FaultyConnection(real(*args, **kwargs), counter, fail_at)

    fail_at = -1
    shutil.copy(base, path)
    with monkeypatch.context() as m:
        m.setattr(db_module.sqlite3, "connect", connect)
        repaired = repair_store(path)
    assert repaired.dropped == ("c0",) and repaired.head.count == 3
    n_statements, outcomes = counter[0], set()
    assert n_statements > 5
    for k in range(1, n_statements + 1):
        shutil.copy(base, path)
        counter[0], fail_at = 0, k
        with monkeypatch.context() as m:
            m.setattr(db_module.sqlite3, "connect", connect)
            try:
                repair_store(path)
                outcomes.add("repaired")
            except (sqlite3.OperationalError, StoreError) as exc:  # StoreError: on opening
                assert "disk is full" in str(exc)
                outcomes.add("failed")
        if _dump(path) != original:  # the repaired store, whole
            with AggregationStore(path, create=False) as store:
                assert check_store(store) == repaired.head, k
    assert outcomes == {"repaired", "failed"}


def test_a_store_a_repair_cannot_fix_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        store.add("a", _payloads(7, 1, None)[0])
    _corrupt_row(path, "a")
    with monkeypatch.context() as m:  # read-only: never written
        m.setattr(db_module, "writable", lambda p: False)
        with pytest.raises(StoreError, match=r"cannot repair store .*: it is read-only .*"
                           r"repair a writable copy"):
            repair_store(path)
    con = sqlite3.connect(path, isolation_level=None)  # settings corrupt: nothing rebuilds them
    con.execute("UPDATE settings SET value = '7' WHERE key = 'max_samples'")
    con.close()
    rc, _, err = _cli(capsys, "store", "verify", "--repair", path)
    _one_error(rc, err, r"settings do not match their integrity digest.*restore it from a "
               "backup")


# ---------------------------------------------------------------------- rollback evidence
def _heads(out: str) -> list[str]:
    return re.findall(r"head ([0-9a-f]{64})", out)


def test_every_change_prints_the_head_and_expect_catches_a_rolled_back_copy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i, s in enumerate(_payloads(8, 4, 5.0)):
        save_stats(s, tmp_path / f"c{i}.ghs")
    path = tmp_path / "s.db"
    rc, out, _ = _cli(capsys, "aggregate", "--store", path, tmp_path / "c0.ghs",
                      tmp_path / "c1.ghs")
    assert rc == 0
    assert re.search(r"added 'c0' .*\n  store head [0-9a-f]{64} \(1 contribution\)\n", out), out
    assert re.search(r"added 'c1' .*\n  store head [0-9a-f]{64} \(2 contributions\)\n", out), out
    at2 = _heads(out)[-1]  # the summary line repeats the last head
    assert _heads(out)[1] == at2
    shutil.copy(path, tmp_path / "backup.db")
    rc, out, _ = _cli(capsys, "aggregate", "--store", path, tmp_path / "c2.ghs")
    at3 = _heads(out)[0]
    rc, out, _ = _cli(capsys, "forget", "--store", path, "--client", "c0")
    assert rc == 0 and re.search(r"now holds 2 contributions, .*; head [0-9a-f]{64} \(2 "
                                 r"contributions\)\n", out), out
    latest = _heads(out)[0]
    assert len({at2, at3, latest}) == 3
    with AggregationStore(path, create=False) as store:  # what the settings record
        assert store.head == StoreHead(latest, 2)
    rc, out, _ = _cli(capsys, "store", "verify", path, "--expect", latest)
    assert rc == 0 and out.endswith(f"head {latest} (2 contributions); it is the expected "
                                    "one\n"), out
    shutil.copy(tmp_path / "backup.db", path)  # rolled back: a sound store, but an older one
    assert _cli(capsys, "store", "verify", path)[0] == 0
    rc, _, err = _cli(capsys, "store", "verify", path, "--expect", latest)
    _one_error(rc, err, rf"store '.*s\.db' has head {at2} \(2 contributions\), not the "
               rf"expected {latest}: it is an older \(rolled-back\) or another copy")
    rc, _, err = _cli(capsys, "store", "verify", path, "--expect", latest[:12])
    _one_error(rc, err, r"--expect must be a store head digest of 64 hex digits .*got "
               rf"'{latest[:12]}'")


def test_the_head_is_the_chain_of_the_rows_in_the_order_added(tmp_path: Path) -> None:
    items = _payloads(9, 4, None)
    with AggregationStore(tmp_path / "s.db") as store:
        assert store.head == StoreHead(integrity.HEAD_EMPTY, 0)
        results = [store.add(f"c{i}", s) for i, s in enumerate(items)]
        again = store.add("c1", items[1])
        assert not again.added and again.head == results[-1].head
        digests = [str(r[0]) for r in store.con.execute(
            "SELECT digest FROM contributions ORDER BY seq")]
        assert results[-1].head == StoreHead(integrity.head_of(digests), 4)
        assert [r.head.count for r in results] == [1, 2, 3, 4]
        store.remove("c1")
        del digests[1]
        assert store.head == StoreHead(integrity.head_of(digests), 3) == check_store(store)


def test_a_store_written_before_heads_records_one_at_its_next_change(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    items = _payloads(10, 3, 5.0)
    with AggregationStore(path) as store:
        for i, s in enumerate(items[:2]):
            store.add(f"c{i}", s)
        with db_module.transaction(store.con) as con:  # as an earlier ghofl wrote it
            con.execute("DELETE FROM settings WHERE key IN ('head', 'n_contributions')")
            db_module.put_settings(con, {})
    with AggregationStore(path) as store:
        assert db_module.head_claim(store.con) is None
        head = check_store(store)  # nothing recorded: the rows name the head
        assert head.count == 2 and inspect_store(store, full=True).ok
        result = store.add("c2", items[2])
        assert db_module.head_claim(store.con) == (result.head.digest, 3)
        assert check_store(store) == result.head


# ---------------------------------------------------------------------- model
def test_a_model_fitted_from_a_store_records_its_head_in_manifest_and_card(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        for i, s in enumerate(_payloads(11, 3, 5.0)):
            head = store.add(f"c{i}", s).head
    rc, _, err = _cli(capsys, "fit", path, "--heads", "nb,lda", "--out", tmp_path / "m")
    assert rc == 0, err
    stats = json.loads((tmp_path / "m" / MANIFEST).read_text())["stats"]
    assert stats["store_head"] == head.digest and stats["contributions"] == 3
    card = (tmp_path / "m" / CARD_FILE).read_text()
    assert f"- Fitted from: 3 contributions, store head digest {head.digest} " in card
    assert "- Clients: 3 (contributions recorded in the aggregation store)" in card
    assert "Clients: not recorded" not in card
    rc, out, _ = _cli(capsys, "store", "verify", path, "--expect", stats["store_head"])
    assert rc == 0 and "it is the expected one" in out


def test_the_card_says_what_a_store_total_was_fitted_from() -> None:
    manifest = {"stats": {"classes": ["a", "b"], "counts": [3, 4], "n_samples": 7,
                          "contributions": 5, "store_head": "ab" * 32}}
    card = model_card(manifest)
    assert f"- Fitted from: 5 contributions, store head digest {'ab' * 32} " in card
    assert "- Clients: 5 (contributions recorded" in card
    plain = model_card({"stats": {"classes": ["a"], "counts": [3]}})
    assert "Fitted from" not in plain and "- Clients: not recorded" in plain
