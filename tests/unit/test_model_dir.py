"""The model directory: save_model / load_model round trips, checks, and atomicity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError, NotFittedError
from ghofl.heads import make_head
from ghofl.heads.base import Head
from ghofl.heads.model_dir import MANIFEST, MODEL_FORMAT, load_model, save_model
from ghofl.stats import ClientStats, compute_stats
from tests.helpers import gaussian_mixture


@pytest.fixture(scope="module")
def fitted() -> tuple[ClientStats, dict[str, Head], np.ndarray]:
    x, y = gaussian_mixture(4, num_classes=3, dim=4, n=150)
    stats = compute_stats(x, y, ("a", "b", "c"))
    heads = {n: make_head(n).fit_from_stats(stats) for n in ("nb", "lda")}
    return stats, heads, x


def test_round_trip_predicts_identically(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, x = fitted
    out = save_model(tmp_path / "m", heads, stats_meta=stats.meta,
                     extra={"stats": {"n_samples": stats.n_samples}, "round": 3},
                     fit_seconds={"nb": 0.5})
    assert out == tmp_path / "m"
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "lda.ghh", "nb.ghh"])
    loaded, manifest = load_model(out)
    assert list(loaded) == ["nb", "lda"]
    for name, head in heads.items():
        np.testing.assert_array_equal(loaded[name].predict(x), head.predict(x))
    assert manifest["format"] == MODEL_FORMAT and manifest["format_version"] == 1
    assert manifest["stats"]["classes"] == ["a", "b", "c"]
    assert manifest["stats"]["n_samples"] == 150 and manifest["round"] == 3
    assert manifest["heads"]["nb"]["fit_seconds"] == 0.5
    assert "fit_seconds" not in manifest["heads"]["lda"]
    assert manifest["heads"]["lda"]["params"]["shrinkage"] == 0.05


def test_an_interrupted_write_leaves_nothing(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats, heads, _ = fitted
    import ghofl.heads.model_dir as model_dir
    from ghofl.heads.registry import save_head as real

    written: list[str] = []

    def fail_on_second(head: Head, path: Path) -> int:
        if written:
            raise OSError("disk full")
        written.append(str(path))
        return real(head, path)

    monkeypatch.setattr(model_dir, "save_head", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    assert written and list(tmp_path.iterdir()) == []
    # an existing model directory survives a failed replacement unchanged
    monkeypatch.setattr(model_dir, "save_head", real)
    save_model(tmp_path / "m", {"nb": heads["nb"]}, stats_meta=stats.meta)
    written.clear()
    monkeypatch.setattr(model_dir, "save_head", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [MANIFEST, "nb.ghh"]


def test_save_refuses_what_it_must_not_replace_or_write(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("k")
    with pytest.raises(InputError, match=r"refusing to replace out_dir '.*data': it is a "
                       r"non-empty directory that is not a ghofl model directory"):
        save_model(tmp_path / "data", heads, stats_meta=stats.meta)
    with pytest.raises(ConfigError, match=r"save_model extra key 'heads' is reserved"):
        save_model(tmp_path / "m", heads, stats_meta=stats.meta, extra={"heads": 1})
    with pytest.raises(ConfigError, match=r"head name '\.\./x' cannot name a file"):
        save_model(tmp_path / "m", {"../x": heads["nb"]}, stats_meta=stats.meta)
    with pytest.raises(ConfigError, match=r"needs at least one fitted head"):
        save_model(tmp_path / "m", {}, stats_meta=stats.meta)
    other = compute_stats(np.ones((2, 4)), np.array([0, 1]), ("a", "b"))
    with pytest.raises(ConfigError, match=r"head 'nb' was fitted on 3 classes in dimension 4, "
                       r"but stats_meta describes 2 classes"):
        save_model(tmp_path / "m", heads, stats_meta=other.meta)
    with pytest.raises(NotFittedError):
        save_model(tmp_path / "m", {"nb": make_head("nb")}, stats_meta=stats.meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_load_errors_are_named(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    with pytest.raises(InputError, match=r"model directory '.*nope' does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(InputError, match=r"has no manifest\.json, so it is not a ghofl model "
                       r"directory"):
        load_model(tmp_path)
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    manifest = json.loads((m / MANIFEST).read_text())
    (m / MANIFEST).write_text(json.dumps({**manifest, "format_version": 9}))
    with pytest.raises(InputError, match=r"has format version 9, newer than this ghofl "
                       r"supports \(1\); upgrade ghofl"):
        load_model(m)
    manifest["heads"]["nb"]["file"] = "../nb.ghh"
    (m / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"lists head 'nb' without a valid file name"):
        load_model(m)
    (m / MANIFEST).write_text("{not json")
    with pytest.raises(InputError, match=r"is not valid JSON"):
        load_model(m)
