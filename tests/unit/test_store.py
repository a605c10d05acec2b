"""AggregationStore: recording, idempotency, conflicts, exact removal, crash safety."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import IncompatibleStatsError, StatsFormatError, StoreConflictError, StoreError
from ghofl.heads.registry import make_head
from ghofl.stats import ClientStats, compute_stats, save_stats, sum_stats
from ghofl.store import AggregationStore, content_sha256, is_store, read_total

C, D = 3, 4


def _payloads(seed: int, k: int, clip: float | None, mode: str = "full", n: int = 40,
              d: int = D) -> list[ClientStats]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        m = int(rng.integers(1, n))  # an empty client would repeat another empty payload
        scale = 10 ** rng.uniform(-1, 1)
        x = rng.normal(scale=scale, size=(m, d)) + rng.normal(scale=2 * scale, size=d)
        own = rng.choice(C, size=int(rng.integers(1, C + 1)), replace=False)
        out.append(compute_stats(x, rng.choice(own, m), C, mode,  # type: ignore[arg-type]
                                 clip_norm=clip))
    return out


def _identical(a: ClientStats, b: ClientStats) -> bool:
    """Bit-for-bit equality (metadata, counts, every array)."""
    if a.meta.differences(b.meta) or a.n_clipped != b.n_clipped:
        return False
    return all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in zip(a.arrays().values(), b.arrays().values(), strict=True)
    )


def _fresh(path: Path, items: dict[str, ClientStats]) -> ClientStats:
    """The total of a new store fed ``items`` (in reverse id order, to show order is moot)."""
    with AggregationStore(path) as store:
        for cid in sorted(items, reverse=True):
            store.add(cid, items[cid])
        return store.total()


# ---------------------------------------------------------------------- add
def test_add_is_idempotent_and_reports_what_it_did(tmp_path: Path) -> None:
    a, b = _payloads(0, 2, clip=5.0)
    with AggregationStore(tmp_path / "s.db") as store:
        first = store.add("a", a)
        assert first.added and first.n_contributions == 1 and first.total_samples == a.n_samples
        again = store.add("a", a)
        assert again.status == "already_present" and not again.added
        assert again.contribution == first.contribution and again.n_contributions == 1
        store.add("b", b)
        assert [c.client_id for c in store.contributions()] == ["a", "b"]
        info = store.contributions()[0]
        assert info.sha256 == content_sha256(a) and info.clip_norm == 5.0
        assert info.n_samples == a.n_samples and info.added_at.endswith("+00:00")
        assert store.total().n_samples == a.n_samples + b.n_samples
        assert store.exact_path == "fixed-point" and len(store) == 2
        assert _identical(store.get("b"), b)


def test_conflicts_are_refused(tmp_path: Path) -> None:
    a, b = _payloads(1, 2, clip=None)
    with AggregationStore(tmp_path / "s.db") as store:
        store.add("a", a)
        with pytest.raises(StoreConflictError, match="client 'a' already contributed another "
                           r"payload .*forget it first \(ghofl forget --client a\)"):
            store.add("a", b)
        with pytest.raises(StoreConflictError, match=r"this payload .* was already contributed "
                           "by client 'a'; recording it again as 'z' would count the same "
                           "samples twice"):
            store.add("z", a)
        assert len(store) == 1 and store.total().n_samples == a.n_samples


@pytest.mark.parametrize(
    ("other", "match"),
    [
        ({"mode": "pooled"}, r"differ in mode \('full' vs 'pooled'\)"),
        ({"clip": 7.0}, r"differ in clipping bound \(R=5 vs R=7\)"),
        ({"clip": None}, r"differ in clipping bound \(R=5 vs none\)"),
        ({"d": 5}, r"differ in dim \(4 vs 5\)"),
    ],
)
def test_incompatible_payloads_are_refused_with_the_difference(
    tmp_path: Path, other: dict[str, object], match: str
) -> None:
    kw: dict[str, object] = {"clip": 5.0, **other}
    with AggregationStore(tmp_path / "s.db") as store:
        store.add("a", _payloads(2, 1, clip=5.0)[0])
        with pytest.raises(IncompatibleStatsError, match=match):
            store.add("b", _payloads(3, 1, **kw)[0])  # type: ignore[arg-type]
        assert len(store) == 1


def test_bad_ids_digests_and_bounds(tmp_path: Path) -> None:
    (a,) = _payloads(4, 1, clip=5.0, n=60)
    with AggregationStore(tmp_path / "s.db", max_contributions=1, max_samples=1000) as store:
        with pytest.raises(StoreError, match=r"a client id must be 1 to 256 printable"):
            store.add(" a", a)
        with pytest.raises(StoreError, match="payload_sha256 must be a SHA-256 digest of 64"):
            store.add("a", a, payload_sha256="abc")
        store.add("a", a, payload_sha256="AB" * 32)
        assert store.contributions()[0].sha256 == "ab" * 32
        with pytest.raises(StoreError, match=r"already holds 1 contributions, its maximum "
                           r"\(max_contributions=1"):
            store.add("b", _payloads(5, 1, clip=5.0)[0])
    with pytest.raises(StoreError, match="was created with max_contributions=1; got "
                       "max_contributions=2"):
        AggregationStore(tmp_path / "s.db", max_contributions=2)
    with AggregationStore(tmp_path / "m.db", max_samples=10) as store, \
            pytest.raises(StoreError, match=r"cannot add the contribution of client 'a'.*more "
                          "samples than the public maximum M=10"):
        store.add("a", a)


def test_unknown_ids_empty_and_foreign_files(tmp_path: Path) -> None:
    with AggregationStore(tmp_path / "s.db") as store:
        with pytest.raises(StoreError, match=r"has never received a contribution"):
            store.total()
        store.add("a", _payloads(6, 1, clip=None)[0])
        with pytest.raises(StoreError, match=r"has no contribution from client 'b'; it holds "
                           r"1 \('a'\)"):
            store.remove("b")
    with pytest.raises(StoreError, match=r"store '.*nope.db' does not exist"):
        AggregationStore(tmp_path / "nope.db", create=False)
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(StoreError, match="is an empty file, not an aggregation store"):
        AggregationStore(tmp_path / "empty.db", create=False)
    assert (tmp_path / "empty.db").read_bytes() == b""
    (tmp_path / "text.db").write_text("hello")
    with pytest.raises(StoreError, match="is not an aggregation store"):
        AggregationStore(tmp_path / "text.db")
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="is a SQLite database but not a ghofl aggregation "
                       r"store \(it has the tables t\)"):
        AggregationStore(tmp_path / "other.db")


def test_read_total_sniffs_the_content(tmp_path: Path) -> None:
    parts = _payloads(7, 3, clip=5.0)
    with AggregationStore(tmp_path / "total.ghs") as store:  # a store under a .ghs name
        for i, p in enumerate(parts):
            store.add(f"c{i}", p)
        want = store.total()
    save_stats(want, tmp_path / "real.db")  # a statistics file under a .db name
    assert is_store(tmp_path / "total.ghs") and not is_store(tmp_path / "real.db")
    assert _identical(read_total(tmp_path / "total.ghs"), want)
    assert _identical(read_total(tmp_path / "real.db"), want)
    with pytest.raises(StatsFormatError, match=r"'.*missing' does not exist"):
        read_total(tmp_path / "missing")


# ---------------------------------------------------------------------- exact removal
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(2, 12), clip=st.booleans(),
       mode=st.sampled_from(["full", "pooled", "gram", "diag"]), data=st.data())
def test_removal_equals_a_fresh_aggregation_of_the_rest(
    tmp_path_factory: pytest.TempPathFactory, seed: int, k: int, clip: bool, mode: str,
    data: st.DataObject,
) -> None:
    tmp = tmp_path_factory.mktemp("rm")
    parts = dict(zip([f"c{i:02d}" for i in range(k)],
                     _payloads(seed, k, 3.0 if clip else None, mode), strict=True))
    gone = data.draw(st.lists(st.sampled_from(sorted(parts)), unique=True, max_size=k))
    with AggregationStore(tmp / "s.db") as store:
        for cid in parts:
            store.add(cid, parts[cid])
        for cid in gone:
            store.remove(cid)
        got = store.total()
    rest = {cid: s for cid, s in parts.items() if cid not in gone}
    if rest:
        assert _identical(got, _fresh(tmp / "fresh.db", rest))
        ordered = sum_stats([rest[cid] for cid in sorted(rest)])
        if not clip:  # recompute path: the canonical float sum, bit for bit
            assert _identical(got, ordered)
        np.testing.assert_array_equal(got.counts, ordered.counts)
        assert got.allclose(ordered, rtol=1e-12)
    else:
        assert _identical(got, ClientStats.zeros(got.meta))


@pytest.mark.parametrize("clip", [4.0, None])
def test_late_joiners_change_the_total_and_the_fit(tmp_path: Path, clip: float | None) -> None:
    early, late = _payloads(8, 4, clip, n=80), _payloads(9, 2, clip, n=80)
    x = np.random.default_rng(0).normal(size=(50, D))
    with AggregationStore(tmp_path / "s.db") as store:
        for i, p in enumerate(early):
            store.add(f"e{i}", p)
        before = store.total()
        for i, p in enumerate(late):
            store.add(f"l{i}", p)
        after = store.total()
    assert after.n_samples == before.n_samples + sum(p.n_samples for p in late)
    assert after.allclose(sum_stats(early + late), rtol=1e-12)
    want = make_head("lda").fit_from_stats(sum_stats(early + late))
    got = make_head("lda").fit_from_stats(after)
    np.testing.assert_array_equal(got.predict(x), want.predict(x))


# ---------------------------------------------------------------------- crash safety
_CHILD = """
import sys
from pathlib import Path
from ghofl.stats import load_stats
from ghofl.store import AggregationStore
import hashlib
db, folder = Path(sys.argv[1]), Path(sys.argv[2])
with AggregationStore(db) as store:
    print("ready", flush=True)
    for path in sorted(folder.glob("*.ghs")):
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        store.add(path.stem, load_stats(path), payload_sha256=sha)
        print("added", flush=True)
print("done", flush=True)
"""


def _run_child(script: Path, db: Path, folder: Path,
               kill_after: tuple[int, float] | None) -> int:
    """Run the child; with ``kill_after=(k, s)``, SIGKILL it ``s`` seconds after its k-th add
    (progress-based, so the kill lands mid-run however loaded the machine is)."""
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(folder)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        if kill_after is not None:
            for _ in range(kill_after[0]):
                proc.stdout.readline()
            time.sleep(kill_after[1])
            proc.send_signal(signal.SIGKILL)  # exactly the PID this test started
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _check_consistent(db: Path, payloads: dict[str, ClientStats], tmp: Path) -> int:
    with AggregationStore(db) as store:
        listed = store.contributions()
        total = store.total()
        for info in listed:
            assert _identical(store.get(info.client_id), payloads[info.client_id])
    ids = [c.client_id for c in listed]
    assert len(set(ids)) == len(ids)
    if ids:
        assert _identical(total, _fresh(tmp / f"fresh{len(list(tmp.iterdir()))}.db",
                                        {cid: payloads[cid] for cid in ids}))
    return len(ids)


@pytest.mark.slow
@pytest.mark.parametrize("clip", [3.0, None])
def test_sigkill_at_random_instants_loses_nothing_and_counts_nothing_twice(
    tmp_path: Path, clip: float | None
) -> None:
    folder = tmp_path / "payloads"
    folder.mkdir()
    payloads = {}
    for i, p in enumerate(_payloads(10, 40, clip, n=60, d=24)):
        save_stats(p, folder / f"c{i:02d}.ghs")
        payloads[f"c{i:02d}"] = p
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    work = tmp_path / "check"
    work.mkdir()
    rng = np.random.default_rng(1234)
    seen = []
    for trial in range(4):  # each trial: a new store, killed at a random instant, then re-run
        db = tmp_path / f"s{trial}.db"
        kill = (int(rng.integers(1, 39)), float(rng.uniform(0.0, 0.02)))
        rc = _run_child(script, db, folder, kill_after=kill)
        seen.append((rc, _check_consistent(db, payloads, work)))
        assert _run_child(script, db, folder, kill_after=None) == 0
        assert _check_consistent(db, payloads, work) == len(payloads)
        with AggregationStore(db) as store:
            shas = {c.client_id: c.sha256 for c in store.contributions()}
        assert shas == {cid: hashlib.sha256((folder / f"{cid}.ghs").read_bytes()).hexdigest()
                        for cid in payloads}
    assert any(rc == -signal.SIGKILL and 0 < n < len(payloads) for rc, n in seen), seen


@pytest.mark.parametrize(("message", "cause"), [
    ("database or disk is full", "the disk is full"),
    ("attempt to write a readonly database", "the store is read-only"),
    ("database is locked", "another process holds the store's lock"),
    ("database disk image is malformed", "the store file is corrupt"),
])
def test_sqlite_failures_are_one_line_errors_naming_the_cause(message: str, cause: str) -> None:
    from ghofl.cli.main import EXPECTED_ERRORS, describe_error

    exc = sqlite3.OperationalError(message)
    assert isinstance(exc, EXPECTED_ERRORS)
    text = describe_error(exc)
    assert "\n" not in text and cause in text and message in text
