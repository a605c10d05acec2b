"""``ghofl aggregate --store``, ``ghofl store show`` and ``ghofl forget`` run for real."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from ghofl.heads.registry import make_head
from ghofl.moments.core import GhoflWarning
from ghofl.stats import ClientStats, compute_stats, load_stats, save_stats, sum_stats
from ghofl.store import AggregationStore, read_total
from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli

C, D, K = 3, 5, 4
HEADS = ("nb", "lda", "qda", "fedcgs")


def _write_clients(folder: Path, clip: float | None) -> tuple[np.ndarray, list[ClientStats]]:
    x, y = gaussian_mixture(11, num_classes=C, dim=D, n=400, sep=1.5)
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), K)
    stats = [compute_stats(x[p], y[p], C, "full", clip_norm=clip) for p in parts]
    for i, s in enumerate(stats):
        save_stats(s, folder / f"c{i}.ghs")
    return x, stats


def _ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stderr


def _fail(r: subprocess.CompletedProcess[str], match: str) -> None:
    """Exit status 2, one line ``ghofl: error: ...`` matching ``match``, no traceback."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("ghofl: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert re.search(match, r.stderr), r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("clip", [6.0, None])
def test_store_flow_and_exact_unlearning(tmp_path: Path, clip: float | None) -> None:
    x, stats = _write_clients(tmp_path, clip)
    r = run_cli("aggregate", "--store", "fed.db", "c0.ghs", "c1.ghs", "c2.ghs", cwd=tmp_path)
    _ok(r)
    assert "added 'c0' from c0.ghs" in r.stdout and "store fed.db: 3 contributions" in r.stdout
    # late joiner under an explicit id, with the total written too; re-submission is idempotent
    r = run_cli("aggregate", "--store", "fed.db", "c3.ghs", "--client-id", "late",
                "--out", "total.ghs", cwd=tmp_path)
    _ok(r)
    assert "added 'late'" in r.stdout and "4 contributions" in r.stdout
    r = run_cli("aggregate", "--store", "fed.db", "c1.ghs", cwd=tmp_path)
    _ok(r)
    assert "'c1' already present with the same payload" in r.stdout
    assert "4 contributions" in r.stdout
    assert load_stats(tmp_path / "total.ghs").allclose(sum_stats(stats), rtol=1e-12)
    # conflicts: another payload under a known id, the same payload under a new id
    _fail(run_cli("aggregate", "--store", "fed.db", "c2.ghs", "--client-id", "c0",
                  cwd=tmp_path), "cannot record 'c2.ghs' as client 'c0'.*already contributed "
          "another payload")
    shutil.copy(tmp_path / "c2.ghs", tmp_path / "copy.ghs")
    _fail(run_cli("aggregate", "--store", "fed.db", "copy.ghs", cwd=tmp_path),
          "was already contributed by client 'c2'")
    r = run_cli("store", "show", "fed.db", "--json", cwd=tmp_path)
    _ok(r)
    shown = json.loads(r.stdout)
    assert [c["client_id"] for c in shown["items"]] == ["c0", "c1", "c2", "late"]
    assert shown["total_samples"] == 400
    assert shown["exact_path"] == ("recompute" if clip is None else "fixed-point")
    r = run_cli("store", "show", "fed.db", cwd=tmp_path)
    _ok(r)
    assert "late" in r.stdout and "4 contributions, total n=400 samples" in r.stdout
    # exact unlearning: forget c1, every closed-form head predicts as if c1 never joined
    r = run_cli("forget", "--store", "fed.db", "--client", "c1", cwd=tmp_path)
    _ok(r)
    assert f"forgot 'c1': n={stats[1].n_samples} samples" in r.stdout
    _fail(run_cli("forget", "--store", "fed.db", "--client", "c1", cwd=tmp_path),
          "has no contribution from client 'c1'")
    after = read_total(tmp_path / "fed.db")
    rest = {"c0": stats[0], "c2": stats[2], "late": stats[3]}
    with AggregationStore(tmp_path / "fresh.db") as fresh:
        for cid, s in rest.items():
            fresh.add(cid, s)
        fresh_total = fresh.total()
    assert all(np.array_equal(a, b) for a, b in zip(after.arrays().values(),
               fresh_total.arrays().values(), strict=True) if a is not None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GhoflWarning)
        for name in HEADS:
            got = make_head(name).fit_from_stats(after).predict(x)
            np.testing.assert_array_equal(got, make_head(name).fit_from_stats(
                fresh_total).predict(x))
            plain = make_head(name).fit_from_stats(sum_stats(list(rest.values()))).predict(x)
            assert np.mean(got == plain) >= 0.99  # float sum: equal up to exact ties


def test_aggregate_refuses_double_counting_and_overwriting_inputs(tmp_path: Path) -> None:
    _write_clients(tmp_path, None)
    shutil.copy(tmp_path / "c0.ghs", tmp_path / "twin.ghs")
    cases = [
        (["c0.ghs", "c1.ghs", "--out", "c1.ghs"],
         "--out 'c1.ghs' is the payload 'c1.ghs': writing it would overwrite an input"),
        (["c0.ghs", str(tmp_path / "c0.ghs"), "--out", "t.ghs"],
         r"payload '/.*c0\.ghs' is given twice \(also as 'c0\.ghs'\)"),
        (["c0.ghs", "twin.ghs", "--out", "t.ghs"],
         "payloads 'c0.ghs' and 'twin.ghs' hold the same bytes"),
        (["c0.ghs"], "aggregate needs --out FILE .* or --store DB"),
        (["c0.ghs", "--client-id", "x", "--out", "t.ghs"], "--client-id names a payload in a "
         "store; use it with --store DB"),
        (["c0.ghs", "c1.ghs", "--store", "s.db", "--client-id", "x"],
         "--client-id names one payload but 2 were given"),
    ]
    for args, match in cases:
        _fail(run_cli("aggregate", *args, cwd=tmp_path), match)
    assert not (tmp_path / "t.ghs").exists() and not (tmp_path / "s.db").exists()
    assert load_stats(tmp_path / "c1.ghs").n_samples == 100
    _fail(run_cli("store", "show", "none.db", cwd=tmp_path), "store 'none.db' does not exist")


def test_fit_accepts_a_store_where_it_accepts_a_total(tmp_path: Path) -> None:
    x, _ = _write_clients(tmp_path, 6.0)
    _ok(run_cli("aggregate", "--store", "fed.db", "c0.ghs", "c1.ghs", "c2.ghs", "c3.ghs",
                "--out", "total.ghs", cwd=tmp_path))
    for source, out in (("fed.db", "from-store"), ("total.ghs", "from-file")):
        _ok(run_cli("fit", source, "--heads", "nb,lda", "--out", out, cwd=tmp_path))
    from ghofl.model.directory import load_model

    a, _ = load_model(tmp_path / "from-store")
    b, _ = load_model(tmp_path / "from-file")
    for name in ("nb", "lda"):
        np.testing.assert_array_equal(a[name].predict(x), b[name].predict(x))


def test_store_show_and_forget_refuse_an_empty_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ghofl.cli.main import main

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for argv in (["store", "show", str(empty)], ["forget", "--store", str(empty), "--client", "a"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(r"ghofl: error: .*is an empty file, not an aggregation store.*\n", err)
    assert empty.read_bytes() == b""
