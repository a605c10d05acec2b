"""ghofl.client.stats_cache and the ClientApp's ``stats-cache`` node config key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.client.job import ClientJob, client_statistics
from ghofl.client.stats_cache import cache_key, cached_statistics
from ghofl.stats.schema import schema_for

CLASSES = ("a", "b", "c")


def _data(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.normal(size=(40, 6)), y=rng.integers(0, 3, 40))
    return path


def _same(a: object, b: object) -> None:
    ia, fa = schema_for("pooled").flatten(a)  # type: ignore[arg-type]
    ib, fb = schema_for("pooled").flatten(b)  # type: ignore[arg-type]
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(fa, fb)  # bit for bit


def test_second_call_reads_the_cache_bit_for_bit(tmp_path: Path) -> None:
    src, job = _data(tmp_path / "d.npz"), ClientJob(CLASSES, "pooled", clip_norm=3.0)
    first, hit1 = cached_statistics(src, job, tmp_path / "cache")
    second, hit2 = cached_statistics(src, job, tmp_path / "cache")
    assert (hit1, hit2) == (False, True)
    _same(first, client_statistics(src, job))
    _same(second, first)
    assert second.meta == first.meta


def test_key_changes_with_the_data_and_the_job(tmp_path: Path) -> None:
    src, job = _data(tmp_path / "d.npz"), ClientJob(CLASSES, "pooled", clip_norm=3.0)
    key = cache_key(src, job)
    assert cache_key(src, ClientJob(CLASSES, "pooled", clip_norm=2.0)) != key
    assert cache_key(src, ClientJob(CLASSES, "pooled", clip_norm=3.0, holdout_fraction=0.1)) != key
    _data(src, seed=1)
    assert cache_key(src, job) != key
    stats, hit = cached_statistics(src, job, tmp_path / "cache")
    assert not hit  # the new data is never answered from the old entry
    _same(stats, client_statistics(src, job))


def test_damaged_entry_is_recomputed(tmp_path: Path) -> None:
    src, job = _data(tmp_path / "d.npz"), ClientJob(CLASSES, "pooled", clip_norm=3.0)
    cached_statistics(src, job, tmp_path / "cache")
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    stats, hit = cached_statistics(src, job, tmp_path / "cache")
    assert not hit
    _same(stats, client_statistics(src, job))
    assert cached_statistics(src, job, tmp_path / "cache")[1]


def test_no_cache_dir_computes(tmp_path: Path) -> None:
    src, job = _data(tmp_path / "d.npz"), ClientJob(CLASSES, "pooled", clip_norm=3.0)
    assert cached_statistics(src, job, None)[1] is False
    assert not (tmp_path / "cache").exists()


def test_client_app_reports_the_cache_hit(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from ghofl.integrations.flower.client_app import RunSetup, _input_dim, _lazy, npz_shape
    from ghofl.server.plan import FederationPlan

    src, job = _data(tmp_path / "d.npz"), ClientJob(CLASSES, "full", clip_norm=3.0)
    setup = RunSetup(FederationPlan(job), job, None, None, None)  # no evaluation stage
    infos: list[dict[str, object]] = [{}, {}]
    for info in infos:
        _lazy(src, setup, str(tmp_path / "cache"), info)()
    assert [i["stats-cached"] for i in infos] == [False, True]
    # with the evaluation stage: the training part only, never from the cache
    evaluating = RunSetup(FederationPlan(job), job, None, None, None, {"federated-eval": 0.25})
    info: dict[str, object] = {}
    part = _lazy(src, evaluating, str(tmp_path / "cache"), info)()
    assert info["stats-cached"] is False and 0 < part.n_samples < 40
    assert npz_shape(src, "x") == (40, 6) and npz_shape(src, "nope") is None
    assert _input_dim(src) == 6
