"""ClientJob (run-config round trip, validation) and client_statistics on every source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import CallableEncoder
from ghofl.client.job import ClientJob, client_statistics
from ghofl.data.embeddings import load_embeddings
from ghofl.errors import ConfigError, InputError
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.job import ServerJob
from ghofl.server.plan import FederationPlan
from ghofl.stats import EncoderInfo, ProjectionSpec, compute_stats
from ghofl.stats.client_stats import ClientStats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import write_npz
from tests.helpers_data import layout_files, make_image_folder, make_image_zip

#: A head every upload mode can fit (the plan checks its heads against the mode).
ANY_MODE = ServerJob(("ncm",))

CLASSES = ("cat", "dog", "emu")


def _same(a: ClientStats, b: ClientStats) -> None:
    assert a.meta == b.meta and a.n_clipped == b.n_clipped
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_allclose(a.sums, b.sums)


# ---------------------------------------------------------------------- config
def _round_trip(job: ClientJob) -> ClientJob:
    """The job through its plan's run config (ghofl.server.config)."""
    return plan_from_config(plan_to_config(FederationPlan(job, server=ANY_MODE))).client


def test_config_round_trip_of_the_defaults_and_of_every_field() -> None:
    plain = ClientJob(CLASSES)
    assert _round_trip(plain) == plain
    full = ClientJob(CLASSES, mode="pooled", encoder="efficientnet-lite0", resolution=260,
                     backend="torch", feature_transform="x+sqrt", projection_dim=16,
                     projection_seed=7, clip_norm=2.5, encoder_name="mine")
    config = plan_to_config(FederationPlan(full, server=ANY_MODE))
    assert all(isinstance(v, str | int | float | bool) for v in config.values())
    assert json.loads(json.dumps(config)) == config
    assert _round_trip(full) == full


def test_none_travels_as_empty_string_or_zero() -> None:
    config = plan_to_config(FederationPlan(ClientJob(CLASSES)))
    assert config["encoder"] == "" and config["encoder_name"] == ""
    assert config["projection_dim"] == 0 and config["clip_norm"] == 0.0
    assert json.loads(str(config["classes"])) == list(CLASSES)


def test_the_config_takes_class_lists_and_strings_and_ignores_other_keys() -> None:
    job = plan_from_config({"classes": "a, b", "resolution": 128, "out-dir": "o"}).client
    assert job.classes == ("a", "b") and job.resolution == 128
    assert plan_from_config({"classes": ["a", "b"]}).client.classes == ("a", "b")


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({}, r"^run config: classes is required \(JSON list of class names"),
        ({"classes": "a,b", "resolution": "big"},
         r"^run config key 'resolution' must be an integer; got 'big'$"),
        ({"classes": "a,b", "clip_norm": "x"},
         r"^run config key 'clip_norm' must be a number; got 'x'$"),
        ({"classes": "a,b", "mode": "huge"}, r"mode must be one of full, pooled, gram, diag, means; got .huge."),
        ({"classes": "a,b", "mode": 3}, r"^run config key 'mode' must be a string"),
        ({"classes": '["a", 2]'}, r"key 'classes' must be a JSON list of strings"),
        ({"classes": 2}, r"key 'classes' must be a JSON list of names, a list, or a "
                         r"comma-separated string; got 2"),
        ({"classes": "[a"}, r"key 'classes' is not a valid JSON list"),
        ({"classes": "a,a"}, r"ClientJob classes must be unique; got \['a', 'a'\]"),
        ({"classes": "a,b", "projection_dim": -2},
         r"^run config: projection_dim must be an integer >= 1; got -2$"),
        ({"classes": "a,b", "clip_norm": -1.0},
         r"^run config: clip_norm \(the per-sample L2 clipping bound R\) must be a finite number"),
        ({"classes": "a,b", "feature_transform": "log"}, r"feature_transform must be one of"),
        ({"classes": "a,b", "backend": "tf"}, r"^run config: backend must be one of onnx, torch"),
    ],
)
def test_config_errors_name_the_key(config: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        plan_from_config(config)


# ---------------------------------------------------------------------- embeddings sources
@pytest.fixture(scope="module")
def xy() -> tuple[np.ndarray, np.ndarray]:
    return gaussian_mixture(2, num_classes=3, dim=5, n=90)


def test_in_memory_pair_equals_compute_stats(xy: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = xy
    job = ClientJob(CLASSES, mode="pooled", projection_dim=3, projection_seed=4, clip_norm=2.0)
    got = client_statistics((x, y), job)
    want = compute_stats(x, y, CLASSES, "pooled", None, ProjectionSpec(4, 5, 3), clip_norm=2.0)
    _same(got, want)
    assert got.meta.projection == ProjectionSpec(4, 5, 3) and got.meta.clip_norm == 2.0


def test_npz_with_a_subset_of_the_classes_is_mapped_by_name(
    tmp_path: Path, xy: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = xy
    keep = y != 0  # this client has no 'cat'
    labels = y[keep] - 1  # its own class list is (dog, emu)
    path = write_npz(tmp_path / "c.npz", x[keep], labels, classes=["dog", "emu"])
    got = client_statistics(path, ClientJob(CLASSES))
    _same(got, compute_stats(x[keep], y[keep], CLASSES))
    assert got.counts[0] == 0
    assert client_statistics(str(path), ClientJob(CLASSES)).n_samples == int(keep.sum())
    emb = load_embeddings(path)
    _same(client_statistics(emb, ClientJob(CLASSES)), got)


def test_class_names_that_disagree_are_an_error_naming_both_lists(
    tmp_path: Path, xy: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = xy
    path = write_npz(tmp_path / "c.npz", x, y, classes=["cat", "dog", "gnu"])
    with pytest.raises(InputError, match=r"'.*c\.npz' has the classes \[cat, dog, gnu\], which "
                       r"disagree with the federation's class list \[cat, dog, emu\] \(e\.g\. "
                       r"'gnu' is not in it\)"):
        client_statistics(path, ClientJob(CLASSES))


def test_bad_embeddings_are_named(xy: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> None:
    x, y = xy
    bad = x.copy()
    bad[3, 0] = np.inf
    with pytest.raises(InputError, match=r"client embeddings contain NaN or infinite values "
                       r"\(first bad row 3\)"):
        client_statistics((bad, y), ClientJob(CLASSES))
    with pytest.raises(InputError, match=r"client label 2 is out of range for 2 classes"):
        client_statistics((x, y), ClientJob(("a", "b")))
    with pytest.raises(InputError, match=r"embeddings file '.*nope\.npz' does not exist"):
        client_statistics(tmp_path / "nope.npz", ClientJob(CLASSES))


def test_encoder_fingerprints_of_embeddings_inputs(xy: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = xy
    assert client_statistics((x, y), ClientJob(CLASSES)).meta.encoder is None
    named = client_statistics((x, y), ClientJob(CLASSES, encoder_name="lite0"))
    assert named.meta.encoder == EncoderInfo("lite0", 5)
    given = EncoderInfo("mine", 5, "abc")
    sq = client_statistics((np.abs(x), y), ClientJob(CLASSES, feature_transform="x+sqrt"),
                           encoder_info=given)
    assert sq.dim == 10 and sq.meta.encoder is not None
    assert sq.meta.encoder.dim == 10 and "x+sqrt" in sq.meta.encoder.preprocessing
    with pytest.raises(InputError, match=r"encoder 'mine' declares d=4 but the embeddings have "
                       r"d=5"):
        client_statistics((x, y), ClientJob(CLASSES), encoder_info=EncoderInfo("mine", 4))


# ---------------------------------------------------------------------- raw data
def _mean_rgb() -> CallableEncoder:
    return CallableEncoder(lambda b: np.asarray(b, dtype=np.float32).mean(axis=(1, 2)),
                           "mean-rgb", 3, preprocessing="mean over pixels", resolution=32)


@pytest.fixture
def fake_encoder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    calls: list[tuple[str, int, str]] = []

    def get_encoder(name: str, resolution: int = 224, backend: str = "onnx") -> Any:
        calls.append((name, resolution, backend))
        if name == "len":
            return CallableEncoder(lambda b: np.array([[len(t), 1.0] for t in b]), "len", 2)
        return _mean_rgb()

    monkeypatch.setattr("ghofl.client.job.get_encoder", get_encoder)
    return calls


def _expected_images(files: dict[str, np.ndarray], classes: tuple[str, ...]) -> ClientStats:
    rows = sorted(files)  # by class folder, then file name
    x = np.stack([files[r].astype(np.float32).mean(axis=(0, 1)) for r in rows])
    y = np.array([classes.index(r.split("/")[1]) for r in rows])
    info = _mean_rgb().info
    return compute_stats(x.astype(np.float64), y, classes, "full", info)


@pytest.mark.parametrize("kind", ["dir", "zip"])
def test_image_folder_with_the_jobs_encoder(
    tmp_path: Path, fake_encoder: list[tuple[str, int, str]], kind: str
) -> None:
    pytest.importorskip("PIL", reason="image decoding needs Pillow")
    files = layout_files(classes=("dog", "cat"), n_per_class=3, size=(4, 4))
    if kind == "dir":
        src = make_image_folder(tmp_path / "site", files)
    else:
        src = make_image_zip(tmp_path / "site.zip", dict(files), top="site")
    job = ClientJob(("bird", "cat", "dog"), encoder="efficientnet-lite0", resolution=32)
    got = client_statistics(src, job, cache_dir=tmp_path / "cache", batch_size=2)
    _same(got, _expected_images(files, job.classes))
    assert fake_encoder[0] == ("efficientnet-lite0", 32, "onnx")
    assert got.counts.tolist() == [0, 3, 3]
    again = client_statistics(src, job, cache_dir=tmp_path / "cache")  # from the cache
    _same(again, got)
    with pytest.raises(InputError, match=r"has the classes \[cat, dog\], which disagree with the "
                       r"federation's class list \[bird, cat\]"):
        client_statistics(src, ClientJob(("bird", "cat"), encoder="efficientnet-lite0"),
                          cache_dir=tmp_path / "cache")


def test_class_folders_at_the_root_take_the_same_path_as_ghofl_embed(
    tmp_path: Path, fake_encoder: list[tuple[str, int, str]]
) -> None:
    """Every client (CLI, simulator, Flower ClientApp) embeds raw data through one path, so
    an image layout without a train/ folder (<root>/<class>/<image>) works for all of them."""
    pytest.importorskip("PIL", reason="image decoding needs Pillow")
    from ghofl.client.local_data import embed_local_data

    files = layout_files(classes=("dog", "cat"), n_per_class=2, size=(4, 4))
    flat = {rel.split("/", 1)[1]: img for rel, img in files.items()}  # <class>/<image>
    src = make_image_folder(tmp_path / "site", flat)
    job = ClientJob(("cat", "dog"), encoder="efficientnet-lite0", resolution=32)
    got = client_statistics(src, job, cache_dir=tmp_path / "cache")
    _same(got, _expected_images(files, job.classes))
    local = embed_local_data(src, _mean_rgb(), cache_dir=tmp_path / "cache")
    assert local.split == "all" and got.n_samples == local.x.shape[0] == 4
    with pytest.raises(InputError, match=r"holds images but encoder 'len' is a text encoder"):
        client_statistics(src, ClientJob(("cat", "dog"), encoder="len"),
                          cache_dir=tmp_path / "cache")


def test_text_file_with_the_jobs_encoder(
    tmp_path: Path, fake_encoder: list[tuple[str, int, str]]
) -> None:
    path = tmp_path / "site.txt"
    path.write_text("pos good film\nneg bad\n1 fine\n")
    job = ClientJob(("neg", "pos"), encoder="len", clip_norm=100.0)
    got = client_statistics(path, job, cache_dir=tmp_path / "cache")
    x = np.array([[9.0, 1.0], [3.0, 1.0], [4.0, 1.0]])
    _same(got, compute_stats(x, np.array([1, 0, 1]), job.classes, "full",
                             CallableEncoder(len, "len", 2).info, clip_norm=100.0))


def test_raw_data_needs_an_encoder(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    with pytest.raises(ConfigError, match=r"is not an embeddings \.npz archive, and the client "
                       r"job names no encoder"):
        client_statistics(tmp_path / "site", ClientJob(CLASSES))


def test_encoder_info_of_a_registered_encoder_checks_the_dimension(
    fake_encoder: list[tuple[str, int, str]], xy: tuple[np.ndarray, np.ndarray]
) -> None:
    job = ClientJob(CLASSES, encoder="efficientnet-lite0", feature_transform="sqrt")
    info = job.encoder_info(3)
    assert info is not None and info.name == "mean-rgb" and info.preprocessing.endswith("sqrt")
    x, y = xy
    with pytest.raises(InputError, match=r"the embeddings have d=5 but encoder "
                       r"'efficientnet-lite0' produces d=3"):
        client_statistics((x, y), job)
    with pytest.raises(ConfigError, match=r"needs the embedding dimension; pass input_dim"):
        ClientJob(CLASSES, encoder_name="x").encoder_info()
    assert ClientJob(CLASSES).encoder_info(5) is None
