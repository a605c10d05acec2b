"""Fault injection on aggregation stores (issue 25), seeded.

For every fault — a full disk at each SQL statement, a read-only file, folder or medium,
random bit flips over the whole file, truncation at every page boundary, empty and foreign
files, a lost ``-wal`` — the outcome is either the exact correct total or one ``ghofl: error:``
line naming the problem: never a traceback, never a silently different total. The CLI runs in
process (``ghofl.cli.main.main``) for speed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import EXPECTED_ERRORS, describe_error, main
from ghofl.errors import GhoflWarning, StoreError
from ghofl.stats import ClientStats, save_stats
from ghofl.store import AggregationStore
from ghofl.store import _sqlite as db_module
from ghofl.store.verify import verify_store
from tests.helpers_store import FaultyConnection as _FaultyConnection
from tests.helpers_store import same_stats as _same
from tests.helpers_store import store_payloads as _payloads


def _store(path: Path, items: list[ClientStats]) -> ClientStats:
    with AggregationStore(path) as store:
        for i, s in enumerate(items):
            store.add(f"c{i}", s)
        return store.total()


def _cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GhoflWarning)
        rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error(rc: int, err: str, match: str = "") -> None:
    assert rc == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("ghofl: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("ghofl: error: "), err
    assert match.lower() in lines[0].lower(), err


def _total_or_error(path: Path) -> ClientStats | str:
    """The store's total (every row read and checked too), or the one-line error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GhoflWarning)
            with AggregationStore(path, create=False) as store:
                store.contributions()
                return store.total()
    except EXPECTED_ERRORS as exc:
        text = describe_error(exc)
        assert text and "\n" not in text
        return text


@pytest.fixture(params=[5.0, None], ids=["fixed-point", "recompute"])
def clip(request: pytest.FixtureRequest) -> float | None:
    return request.param  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- full disk
def _count_and_fail(monkeypatch: pytest.MonkeyPatch, fail_at: int) -> list[int]:
    counter = [0]
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        return _FaultyConnection(real(*args, **kwargs), counter, fail_at)

    monkeypatch.setattr(db_module.sqlite3, "connect", connect)
    return counter


@pytest.mark.parametrize("command", ["aggregate", "forget"])
def test_a_full_disk_at_every_statement_changes_all_or_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        clip: float | None, command: str) -> None:
    items = _payloads(1, 4, clip)
    base = tmp_path / "base.db"
    before = _store(base, items[:3])
    after = _store(tmp_path / "after.db", items if command == "aggregate" else items[1:3])
    if command == "aggregate":
        save_stats(items[3], tmp_path / "c3.ghs")
        args: tuple[str | Path, ...] = ("aggregate", "--store", tmp_path / "s.db",
                                        tmp_path / "c3.ghs", "--client-id", "c3")
    else:
        args = ("forget", "--store", tmp_path / "s.db", "--client", "c0")
    shutil.copy(base, tmp_path / "s.db")
    with monkeypatch.context() as m:
        counter = _count_and_fail(m, fail_at=-1)
        assert _cli(capsys, *args)[0] == 0
    n_statements = counter[0]
    assert n_statements > 5
    outcomes = set()
    for k in range(1, n_statements + 1):
        shutil.copy(base, tmp_path / "s.db")
        with monkeypatch.context() as m:
            _count_and_fail(m, fail_at=k)
            rc, _, err = _cli(capsys, *args)
        if rc != 0:
            _one_error(rc, err, "disk is full")
        total = _total_or_error(tmp_path / "s.db")
        assert not isinstance(total, str), total
        changed = _same(total, after)
        assert changed or _same(total, before), k
        assert changed or rc != 0, k  # acknowledged only when it happened
        outcomes.add((rc, changed))
    assert {(0, True), (2, False)} <= outcomes, outcomes


# ---------------------------------------------------------------------- read-only
def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("how", ["file", "folder", "media"])
def test_a_read_only_store_is_shown_verified_and_fitted_from_never_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        clip: float | None, how: str) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "s.db"
    expected = _store(store, _payloads(2, 3, clip))
    save_stats(_payloads(3, 1, clip)[0], tmp_path / "late.ghs")
    real_access = os.access
    if how == "file":
        store.chmod(0o444)
    elif how == "folder":
        folder.chmod(0o555)
    if how == "media" or os.geteuid() == 0:  # root writes anyway: emulate what access() says
        monkeypatch.setattr(db_module.os, "access", lambda p, mode, **kw: False
                            if mode & os.W_OK else real_access(p, mode, **kw))
    try:
        state = _snapshot(folder)
        rc, out, _ = _cli(capsys, "store", "show", store)
        assert rc == 0 and "3 contributions" in out
        rc, out, _ = _cli(capsys, "store", "verify", store)
        assert rc == 0 and ": ok" in out
        rc, _, err = _cli(capsys, "fit", store, "--heads", "nb,lda", "--out", tmp_path / "m")
        assert rc == 0, err
        total = _total_or_error(store)
        assert isinstance(total, ClientStats) and _same(total, expected)
        rc, _, err = _cli(capsys, "aggregate", "--store", store, tmp_path / "late.ghs")
        _one_error(rc, err, "read-only")
        rc, _, err = _cli(capsys, "forget", "--store", store, "--client", "c0")
        _one_error(rc, err, "read-only")
        assert _snapshot(folder) == state  # nothing written, no journal or -shm left
    finally:
        folder.chmod(0o755)
        store.chmod(0o644)


# ---------------------------------------------------------------------- bit flips
def test_random_bit_flips_give_the_exact_total_or_one_error_line(
        tmp_path: Path, clip: float | None) -> None:
    """Flip one bit at each of 1,000 seeded positions (over the whole file) of a copy of a
    store, per exact path; each copy gives its exact total or one error line."""
    good = tmp_path / "good.db"
    expected = _store(good, _payloads(4, 4, clip))
    data = good.read_bytes()
    rng = np.random.default_rng(2026)
    positions = rng.choice(len(data) * 8, size=1000, replace=False)
    path = tmp_path / "flipped.db"
    kinds = {"exact": 0, "error": 0}
    start = time.perf_counter()
    for bit in positions:
        copy = bytearray(data)
        copy[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(copy))
        got = _total_or_error(path)
        if isinstance(got, str):
            kinds["error"] += 1
        else:
            assert _same(got, expected), f"bit {bit} changed the total silently"
            kinds["exact"] += 1
    elapsed = time.perf_counter() - start
    assert kinds["exact"] > 0 and kinds["error"] > 0, kinds
    assert elapsed < 60, f"{elapsed:.1f} s"


# ---------------------------------------------------------------------- truncation
def test_truncation_at_every_page_boundary_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clip: float | None) -> None:
    good = tmp_path / "good.db"
    expected = _store(good, _payloads(5, 4, clip))
    data = good.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    path = tmp_path / "cut.db"
    for end in range(0, len(data), page):
        path.write_bytes(data[:end])
        got = _total_or_error(path)
        assert isinstance(got, str) or _same(got, expected), end
    path.write_bytes(data[: 2 * page])
    rc, _, err = _cli(capsys, "store", "verify", path)
    _one_error(rc, err)


# ---------------------------------------------------------------------- empty, foreign
def _foreign_db(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(5000)), "not a SQLite database"),
    (lambda p: p.write_text("client,n\na,3\n"), "not a SQLite database"),
    (_foreign_db, "not a ghofl aggregation store"),
], ids=["empty", "random", "text", "other-sqlite"])
@pytest.mark.parametrize("command", ["show", "verify", "forget", "aggregate", "fit"])
def test_empty_and_foreign_files_are_never_taken_for_stores(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, match: str,
        command: str) -> None:
    path = tmp_path / "x.db"
    make(path)
    before = path.read_bytes()
    save_stats(_payloads(6, 1, None)[0], tmp_path / "a.ghs")
    args: dict[str, tuple[str | Path, ...]] = {
        "show": ("store", "show", path), "verify": ("store", "verify", path),
        "forget": ("forget", "--store", path, "--client", "a"),
        "aggregate": ("aggregate", "--store", path, tmp_path / "a.ghs"),
        "fit": ("fit", path, "--out", tmp_path / "m"),
    }
    rc, _, err = _cli(capsys, *args[command])
    _one_error(rc, err, "" if command == "fit" else match)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ghs", "x.db"]


# ---------------------------------------------------------------------- lost -wal
def test_acknowledged_changes_survive_losing_every_side_file(
        tmp_path: Path, clip: float | None) -> None:
    items = _payloads(7, 5, clip)
    path = tmp_path / "s.db"
    with AggregationStore(path) as store:
        for i, s in enumerate(items):
            store.add(f"c{i}", s)
            for side in ("-wal", "-shm", "-journal"):  # lost while the store is open
                Path(f"{path}{side}").unlink(missing_ok=True)
        store.remove("c1")
    for side in ("-wal", "-shm", "-journal"):
        Path(f"{path}{side}").unlink(missing_ok=True)
    expected = _store(tmp_path / "fresh.db", [s for i, s in enumerate(items) if i != 1])
    with AggregationStore(path, create=False) as store:
        assert [c.client_id for c in store.contributions()] == ["c0", "c2", "c3", "c4"]
        assert _same(store.total(), expected)
    assert verify_store(path)[0] == []


def test_a_store_held_in_wal_mode_is_checkpointed_after_every_commit(
        tmp_path: Path, clip: float | None) -> None:
    """An older store in WAL mode, held open by another process, cannot switch journal: its
    acknowledged changes are checkpointed into the database file, so losing -wal loses
    nothing."""
    items = _payloads(8, 3, clip)
    path = tmp_path / "s.db"
    _store(path, items[:1])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("SELECT COUNT(*) FROM contributions").fetchone()  # holds the WAL open
    try:
        with AggregationStore(path) as store:
            assert store.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            for i, s in enumerate(items[1:], 1):
                store.add(f"c{i}", s)
        wal = Path(f"{path}-wal")
        assert not wal.exists() or wal.stat().st_size == 0
    finally:
        holder.close()
    Path(f"{path}-wal").unlink(missing_ok=True)
    with AggregationStore(path, create=False) as store:
        assert len(store) == 3
        assert store.total().n_samples == sum(s.n_samples for s in items)


# ---------------------------------------------------------------------- migration
def _as_version_1(path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    for sql in ("ALTER TABLE contributions DROP COLUMN digest",
                "ALTER TABLE total DROP COLUMN members", "ALTER TABLE total DROP COLUMN digest",
                "DELETE FROM settings WHERE key = 'digest'",
                "UPDATE settings SET value = '1' WHERE key = 'version'"):
        con.execute(sql)
    con.close()


def test_a_version_1_store_gets_its_digests_on_its_first_writable_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clip: float | None) -> None:
    path = tmp_path / "s.db"
    expected = _store(path, _payloads(9, 3, clip))
    _as_version_1(path)
    with monkeypatch.context() as m:
        m.setattr(db_module, "writable", lambda p: False)
        with pytest.raises(StoreError, match=r"older ghofl \(version 1.*open it once where"):
            AggregationStore(path, create=False)
    with AggregationStore(path, create=False) as store:
        assert _same(store.total(), expected)
        assert db_module.setting(store.con, "version") == "2"
    assert verify_store(path) == ([], 3)
