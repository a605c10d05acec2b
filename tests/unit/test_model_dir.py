"""The model directory: save_model / load_model round trips, checks, atomicity, and the schema
versions of head files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError, NotFittedError, StatsFormatError
from ghofl.heads import make_head
from ghofl.heads.base import Head
from ghofl.heads.registry import (
    HEAD_MAX_SCHEMA_VERSION,
    HEAD_SCHEMA_VERSION,
    load_head,
    save_head,
)
from ghofl.model.directory import MANIFEST, MODEL_FORMAT, load_model, save_model
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.codec import write_safetensors
from ghofl.stats.meta import SCHEMA_VERSION
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
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, "MODEL_CARD.md", "lda.ghh", "nb.ghh"])
    loaded, manifest = load_model(out)
    assert list(loaded) == ["nb", "lda"]
    for name, head in heads.items():
        np.testing.assert_array_equal(loaded[name].predict(x), head.predict(x))
    assert manifest["format"] == MODEL_FORMAT and manifest["format_version"] == 1
    assert manifest["stats"]["classes"] == ["a", "b", "c"]
    assert manifest["stats"]["n_samples"] == 150 and manifest["round"] == 3
    assert manifest["heads"]["nb"]["fit_seconds"] == 0.5
    assert "fit_seconds" not in manifest["heads"]["lda"]
    assert manifest["heads"]["lda"]["params"]["shrinkage"] == "auto"


def test_an_interrupted_write_leaves_nothing(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats, heads, _ = fitted
    import ghofl.model.directory as model_dir
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
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "MODEL_CARD.md", MANIFEST, "nb.ghh"]


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


# ---------------------------------------------------------------------- hardened head files
def _head_parts(p: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__")
    data = raw[8 + n :]
    arrays = {k: np.frombuffer(data, np.float64, int(np.prod(v["shape"])),
                               v["data_offsets"][0]).reshape(v["shape"]).copy()
              for k, v in header.items()}
    return arrays, meta


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda a, m: a["coef_"].__setitem__((0, 0), np.nan),
         r"saved LDAHead array coef_ holds 1 NaN or infinite value\(s\)"),
        (lambda a, m: a.__setitem__("coef_", np.array(1.0)),
         r"saved LDAHead array coef_ has shape \(\); expected \(3, 4\)"),
        (lambda a, m: a.__setitem__("coef_", a["coef_"][:2].copy()),
         r"saved LDAHead array coef_ has shape \(2, 4\); expected \(3, 4\)"),
        (lambda a, m: a.__setitem__("intercept_", a["intercept_"].astype(np.int64)),
         r"saved LDAHead array intercept_ has dtype int64; expected float64"),
        (lambda a, m: m.__setitem__("params", "[1, 2]"),
         r"has a corrupt head header: params is a JSON list, expected an object"),
        (lambda a, m: m.__setitem__("params", '{"shrinkage": null}'),
         r"holds a corrupt head: LDAHead: shrinkage must be"),
        (lambda a, m: m.__setitem__("scalars", "null"),
         r"has a corrupt head header: scalars is a JSON NoneType, expected an object"),
    ],
)
def test_corrupt_head_files_are_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray],
    edit: object, match: str,
) -> None:
    from ghofl.errors import StatsFormatError
    from ghofl.stats.codec import write_safetensors

    stats, heads, _ = fitted
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    arrays, meta = _head_parts(m / "lda.ghh")
    edit(arrays, meta)  # type: ignore[operator]
    write_safetensors(m / "lda.ghh", arrays, meta)  # re-digested: the checks must refuse it
    with pytest.raises(StatsFormatError, match=match):
        load_model(m)


def test_a_head_file_from_another_model_is_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    x, y = gaussian_mixture(5, num_classes=3, dim=4, n=90)
    other_stats = compute_stats(x, y, ("p", "q", "r"))
    other = save_model(tmp_path / "o", {"lda": make_head("lda").fit_from_stats(other_stats)},
                       stats_meta=other_stats.meta)
    (m / "lda.ghh").write_bytes((other / "lda.ghh").read_bytes())
    with pytest.raises(InputError, match=r"head file '.*lda.ghh' does not belong to this model: "
                       r"it was fitted on statistics that differ from the manifest's in class "
                       r"names"):
        load_model(m)


def test_a_non_integer_format_version_is_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    manifest = json.loads((m / MANIFEST).read_text())
    (m / MANIFEST).write_text(json.dumps({**manifest, "format_version": "1"}))
    with pytest.raises(InputError, match=r"has format_version '1'; expected an integer"):
        load_model(m)


def test_heads_with_non_finite_state_are_not_saved(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, _, _ = fitted
    head = make_head("lda").fit_from_stats(stats)
    head.coef_ = np.full_like(head.coef_, np.inf)
    with pytest.raises(ConfigError, match=r"refusing to save head 'lda': saved LDAHead array "
                       r"coef_ holds 12 NaN or infinite value\(s\)"):
        save_model(tmp_path / "m", {"lda": head}, stats_meta=stats.meta)
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------- head schema versions
# Heads stay at version 2 (older ghofl reads them) unless their metadata records a held-out
# fraction; versions 1 to 3 are read, newer ones refused.
def _fitted_lda(holdout: float = 0.0) -> tuple[Head, np.ndarray]:
    x, y = gaussian_mixture(5, num_classes=3, dim=4, n=120)
    stats = compute_stats(x, y, ("a", "b", "c"), holdout_fraction=holdout, holdout_seed=1)
    return make_head("lda").fit_from_stats(stats), x


def _rewrite(p: Path, **header: str) -> None:
    """Rewrite ``p`` with header entries replaced (re-digested, so only the checks refuse it)."""
    arrays, meta = _head_parts(p)
    write_safetensors(p, arrays, {**meta, **header})


def test_heads_are_written_as_version_2_whatever_the_statistics_schema(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == 3 and HEAD_SCHEMA_VERSION == 2
    head, x = _fitted_lda()
    save_head(head, tmp_path / "lda.ghh")
    _, meta = _head_parts(tmp_path / "lda.ghh")
    assert meta["schema_version"] == "2"
    assert json.loads(meta["meta"])["schema_version"] == 2
    np.testing.assert_array_equal(load_head(tmp_path / "lda.ghh").predict(x), head.predict(x))


def test_a_head_of_held_out_statistics_is_written_as_version_3(tmp_path: Path) -> None:
    head, x = _fitted_lda(holdout=0.2)
    assert head.meta_.holdout_fraction == 0.2
    save_head(head, tmp_path / "lda.ghh")
    _, meta = _head_parts(tmp_path / "lda.ghh")
    assert meta["schema_version"] == "3"
    loaded = load_head(tmp_path / "lda.ghh")
    assert loaded.meta_.holdout_fraction == 0.2
    np.testing.assert_array_equal(loaded.predict(x), head.predict(x))


@pytest.mark.parametrize("version", ["1", "2", "3"])
def test_versions_1_to_3_are_read(tmp_path: Path, version: str) -> None:
    """Version 3 is what some builds wrote in every head file; 1 and 2 are older heads."""
    head, x = _fitted_lda()
    save_head(head, tmp_path / "lda.ghh")
    _rewrite(tmp_path / "lda.ghh", schema_version=version)
    np.testing.assert_array_equal(load_head(tmp_path / "lda.ghh").predict(x), head.predict(x))


@pytest.mark.parametrize(
    ("version", "match"),
    [
        ("4", r"uses head schema version 4, newer than this ghofl supports \(3\); upgrade ghofl"),
        ("0", r"uses head schema version 0, older than this ghofl supports \(1\); re-create it"),
        ("two", r"uses head schema version -1, older than this ghofl supports \(1\)"),
    ],
)
def test_versions_it_cannot_read_are_refused(tmp_path: Path, version: str, match: str) -> None:
    head, _ = _fitted_lda()
    save_head(head, tmp_path / "lda.ghh")
    _rewrite(tmp_path / "lda.ghh", schema_version=version)
    with pytest.raises(StatsFormatError, match=match):
        load_head(tmp_path / "lda.ghh")


def test_the_head_bound_holds_when_the_statistics_schema_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statistics schema 4 must not make head version 4 readable."""
    import ghofl.stats.codec as codec

    monkeypatch.setattr(codec, "SCHEMA_VERSION", HEAD_MAX_SCHEMA_VERSION + 1)
    head, _ = _fitted_lda()
    save_head(head, tmp_path / "lda.ghh")
    _rewrite(tmp_path / "lda.ghh", schema_version=str(HEAD_MAX_SCHEMA_VERSION + 1))
    with pytest.raises(StatsFormatError, match=r"uses head schema version 4, newer than this "
                       r"ghofl supports \(3\); upgrade ghofl"):
        load_head(tmp_path / "lda.ghh")


def test_a_version_2_head_with_a_held_out_fraction_is_corrupt(tmp_path: Path) -> None:
    head, _ = _fitted_lda(holdout=0.2)
    save_head(head, tmp_path / "lda.ghh")
    _rewrite(tmp_path / "lda.ghh", schema_version="2")
    with pytest.raises(StatsFormatError, match=r"has head schema version 2 but its metadata "
                       r"records a held-out fraction, which version 3 introduced; the file is "
                       r"corrupt"):
        load_head(tmp_path / "lda.ghh")


# ---------------------------------------------------------------------- head/name binding
def _resigned(manifest: dict[str, object]) -> dict[str, object]:
    from ghofl.model.directory import manifest_digest

    return {**manifest, "digest": manifest_digest(manifest)}


def _repoint(m: Path, resign: bool, **entry: object) -> None:
    manifest = json.loads((m / MANIFEST).read_text())
    manifest["heads"]["lda"] = {**manifest["heads"]["lda"], "file": "nb.ghh", **entry}
    (m / MANIFEST).write_text(json.dumps(_resigned(manifest) if resign else manifest))


@pytest.mark.parametrize(("resign", "entry", "match"), [
    (False, {}, r"lists head 'lda' as a 'lda' head, but '.*nb.ghh' records that it holds a "
                r"'nb' head; the manifest was edited"),
    (True, {}, r"lists head 'lda' as a 'lda' head, but .* holds a 'nb' head"),
    (True, {"head": "nb"}, r"points head 'lda' at 'nb.ghh', which holds a 'nb' head"),
])
def test_a_manifest_pointing_a_head_at_another_heads_file_is_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray],
    resign: bool, entry: dict[str, object], match: str,
) -> None:
    stats, heads, _ = fitted
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    if "head" in entry:  # the editor also recomputes the file digest it points at
        from ghofl.model.directory import file_sha256

        entry = {**entry, "sha256": file_sha256(m / "nb.ghh")}
    _repoint(m, resign, **entry)
    with pytest.raises(InputError, match=match):
        load_model(m)


def test_an_edited_manifest_or_a_swapped_head_file_is_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    m = save_model(tmp_path / "m", heads, stats_meta=stats.meta)
    manifest = json.loads((m / MANIFEST).read_text())
    assert manifest["heads"]["lda"]["head"] == "lda" and len(manifest["digest"]) == 64
    edited = {**manifest, "note": "hand edit"}
    (m / MANIFEST).write_text(json.dumps(edited))
    with pytest.raises(InputError, match=r"does not match its digest: the manifest was edited"):
        load_model(m)
    (m / MANIFEST).write_text(json.dumps(_resigned(edited)))
    assert sorted(load_model(m)[0]) == ["lda", "nb"]  # a re-signed harmless edit loads
    other = save_model(tmp_path / "o", {"lda": make_head("lda", shrinkage=0.5)
                                        .fit_from_stats(stats)}, stats_meta=stats.meta)
    (m / "lda.ghh").write_bytes((other / "lda.ghh").read_bytes())
    with pytest.raises(InputError, match=r"head file '.*lda.ghh' is not the one .* was written "
                       r"with \(its SHA-256 differs\)"):
        load_model(m)


def test_a_head_saved_under_another_registered_name_is_refused(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    stats, heads, _ = fitted
    with pytest.raises(ConfigError, match=r"head name 'qda' is a registered head, but the head "
                       r"given under it is a 'lda' head"):
        save_model(tmp_path / "m", {"qda": heads["lda"]}, stats_meta=stats.meta)
    assert not (tmp_path / "m").exists()
    save_model(tmp_path / "m", {"my-lda": heads["lda"]}, stats_meta=stats.meta)
    assert load_model(tmp_path / "m")[0]["my-lda"].name == "lda"


_SAVING_FOREVER = """
import sys
from pathlib import Path
from ghofl.heads import make_head
from ghofl.model.directory import save_model
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture
x, y = gaussian_mixture(4, num_classes=3, dim=4, n=150)
stats = compute_stats(x, y, ("a", "b", "c"))
heads = {n: make_head(n).fit_from_stats(stats) for n in ("nb", "lda", "qda")}
Path(sys.argv[2]).write_text("ready")
while True:
    save_model(Path(sys.argv[1]), heads, stats_meta=stats.meta)
"""


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_leaves_a_whole_model_and_no_leftover(
    tmp_path: Path, fitted: tuple[ClientStats, dict[str, Head], np.ndarray]
) -> None:
    """SIGKILL of a process saving a model over and over, at seeded random moments: the
    directory always loads (digests checked) and the next write leaves nothing beside it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    stats, heads, _ = fitted
    target = tmp_path / "m"
    save_model(target, heads, stats_meta=stats.meta)
    rng = np.random.default_rng(25)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    left_behind, i = 0, 0

    def writing() -> bool:
        return any(p.name.startswith(".m.") for p in tmp_path.iterdir())

    # six kills at seeded random moments; then, until one has landed mid-write (a loaded
    # machine may land all six between writes), kills as soon as a write is seen under way
    while i < 6 or (left_behind == 0 and i < 40):
        ready = tmp_path / f"ready{i}"
        proc = subprocess.Popen([sys.executable, "-c", _SAVING_FOREVER, str(target),
                                 str(ready)], env=env)
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "writer died"
                time.sleep(0.02)
            if i < 6:
                time.sleep(float(rng.uniform(0.0, 0.3)))
            else:
                while not writing():
                    assert proc.poll() is None and time.monotonic() < deadline, "writer died"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        left_behind += sum(p.name.startswith(".m.") for p in tmp_path.iterdir())
        loaded, _ = load_model(target)  # whole: every digest and binding checks out
        assert set(loaded) in ({"nb", "lda"}, {"nb", "lda", "qda"})
        save_model(target, heads, stats_meta=stats.meta)
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.")]
        assert set(load_model(target)[0]) == {"nb", "lda"}
        i += 1
    assert left_behind > 0  # the kills did land mid-write (else the test proves nothing)
