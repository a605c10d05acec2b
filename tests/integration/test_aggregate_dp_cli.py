"""``ghofl aggregate --dp-epsilon``: the files' total released under central DP, run for real.

The written total is the noised release (its header records the noise levels), its noise has
the accounted scale, its report spends the asked budget, ``ghofl fit`` weighs the noise, and
every input DP cannot serve is refused before anything is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ghofl.cli.io import privacy_report_path
from ghofl.cli.main import main
from ghofl.errors import ConfigError
from ghofl.heads.registry import load_head
from ghofl.stats import ClientStats, compute_stats, load_stats, save_stats, sum_stats
from ghofl.stats.release import NoisyStats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli

pytest.importorskip("dp_accounting")

C, D, K, R = 4, 40, 3, 1.0
FILES = [f"c{i}.ghs" for i in range(K)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three clients' pooled payloads clipped to R, and payloads DP cannot take."""
    w = tmp_path_factory.mktemp("aggdp")
    x, y = gaussian_mixture(3, num_classes=C, dim=D, n=1200, sep=2.0)
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), K)
    for name, p in zip(FILES, parts, strict=True):
        save_stats(compute_stats(x[p], y[p], C, "pooled", clip_norm=R), w / name)
    p = parts[0][:200]
    save_stats(compute_stats(x[p], y[p], C, "pooled"), w / "noclip.ghs")
    save_stats(compute_stats(x[p], y[p], C, "pooled", clip_norm=3 * R), w / "clip3.ghs")
    save_stats(compute_stats(x[p], y[p], C, "pooled", clip_norm=R, holdout_fraction=0.2),
               w / "holdout.ghs")
    return w


def _exact(ws: Path) -> ClientStats:
    return sum_stats([load_stats(ws / f) for f in FILES])


def _aggregate(ws: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["aggregate", *(str(ws / f) for f in FILES), "--out", str(out), *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out


def test_the_release_has_the_accounted_noise_and_spends_the_asked_budget(
        ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.privacy import gaussian_epsilon

    out = tmp_path / "total.ghs"
    text = _aggregate(ws, out, "--dp-epsilon", "4", "--dp-delta", "1e-5", "--seed", "7",
                      capsys=capsys)
    report = json.loads(privacy_report_path(out).read_text())
    p = report["privacy"]
    assert p["epsilon_spent"] == 4.0 and p["delta_spent"] == pytest.approx(1e-5, rel=1e-9)
    # the accountant gives the asked budget back from the reported noise multiplier
    assert gaussian_epsilon(p["noise_multiplier"], 1e-5) == pytest.approx(4.0, rel=1e-3)
    assert p["dp_mode"] == "central" and p["clip_norm"] == R and p["min_class_count"] == 5
    assert p["sensitivity"]["sums"] == R and p["sensitivity"]["scatter"] == R * R
    assert report["noise"] == {"source": "seed", "seed": 7}
    assert [f["path"] for f in report["files"]] == [str(ws / f) for f in FILES]
    assert "differential privacy (central): spent epsilon=4, delta=1e-05" in text
    assert "noise seeded by --seed 7" in text
    assert f"privacy report: {privacy_report_path(out)}" in text

    released, exact = load_stats(out), _exact(ws)
    assert isinstance(released, NoisyStats) and dict(released.noise_sigma) == p["sigma"]
    assert released.n_clipped == 0 and exact.n_clipped > 0  # withheld under DP
    assert np.all(np.abs(released.counts - exact.counts) < 6 * p["sigma"]["counts"] + 1)
    # the sums pass the post-processing unchanged (no class is a placeholder): their error is
    # the Gaussian noise, sigma_sums on each of the C * d = 160 entries
    assert np.all(released.counts >= 5)
    noise = np.asarray(released.sums) - np.asarray(exact.sums)
    assert np.all(noise != 0.0)
    assert 1 / 1.5 < float(noise.std()) / p["sigma"]["sums"] < 1.5
    assert abs(float(noise.mean())) < 4 * p["sigma"]["sums"] / np.sqrt(noise.size)


def test_a_seed_repeats_the_noise_and_os_entropy_does_not(
        ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--dp-epsilon", "2")
    seeded = [tmp_path / f"s{i}.ghs" for i in range(2)]
    for out in seeded:
        _aggregate(ws, out, *args, "--seed", "3", capsys=capsys)
    np.testing.assert_array_equal(load_stats(seeded[0]).sums, load_stats(seeded[1]).sums)
    fresh = [tmp_path / f"e{i}.ghs" for i in range(2)]
    for out in fresh:
        text = _aggregate(ws, out, *args, capsys=capsys)
        assert "noise from OS entropy (not recorded)" in text
        assert json.loads(privacy_report_path(out).read_text())["noise"] == {"source": "os-entropy",
                                                                       "seed": None}
    sums = [np.asarray(load_stats(p).sums) for p in (*fresh, seeded[0])]
    assert not np.array_equal(sums[0], sums[1]) and not np.array_equal(sums[0], sums[2])


def test_ghofl_fit_on_the_release_weighs_its_noise(ws: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _aggregate(ws, tmp_path / "total.ghs", "--dp-epsilon", "4", "--dp-split", "equal",
               "--min-class-count", "2", capsys=capsys)
    p = json.loads((tmp_path / "total.privacy.json").read_text())["privacy"]
    assert p["budget_split"] == "equal" and p["min_class_count"] == 2
    r = run_cli("fit", "total.ghs", "--heads", "lda,ridge", "--out", "model", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lda, ridge = (load_head(tmp_path / "model" / f"{h}.ghh") for h in ("lda", "ridge"))
    assert lda.shrinkage_method_ == "analytic-error+dp-noise"  # type: ignore[attr-defined]
    assert ridge.alpha_rule_ == "gcv+dp-noise"  # type: ignore[attr-defined]


REFUSALS = [
    ("no-clip", ["c0.ghs", "noclip.ghs"], ["--dp-epsilon", "4"],
     r"file '.*noclip\.ghs' has no clipping bound: recompute it with ghofl client-stats "
     r"--clip R; DP needs every client's rows clipped to one public bound"),
    ("two-clips", ["c0.ghs", "clip3.ghs"], ["--dp-epsilon", "4"],
     r"files '.*c0\.ghs' and '.*clip3\.ghs' have different clipping bounds \(R=1 and R=3\); "
     r"DP calibrates the noise to one public bound"),
    ("holdout", ["c0.ghs", "holdout.ghs"], ["--dp-epsilon", "4"],
     r"file '.*holdout\.ghs' has a held-out section \(holdout fraction 0\.2\): DP would count "
     r"each held-out sample twice; recompute it with --holdout 0"),
    ("fedcof", ["c0.ghs", "c1.ghs"], ["--dp-epsilon", "4", "--estimate", "fedcof"],
     r"--estimate fedcof reads each client's own class means, which differential privacy "
     r"does not cover"),
    ("store", ["c0.ghs", "c1.ghs"], ["--dp-epsilon", "4", "--store", "fed.db"],
     r"--dp-epsilon cannot release the total of --store: the store keeps an exact running "
     r"total over every call"),
    ("k-without-dp", ["c0.ghs", "c1.ghs"], ["--min-class-count", "3"],
     r"--min-class-count is the threshold a DP release applies to the noised counts; add "
     r"--dp-epsilon EPS"),
    ("k-zero", ["c0.ghs", "c1.ghs"], ["--dp-epsilon", "4", "--min-class-count", "0"],
     r"--min-class-count must be an integer >= 1; got 0"),
    ("delta-alone", ["c0.ghs", "c1.ghs"], ["--dp-delta", "1e-6"],
     r"--dp-delta needs --dp-epsilon"),
]


@pytest.mark.parametrize(("files", "extra", "match"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_inputs_dp_cannot_serve_are_refused_before_anything_is_written(
        ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str],
        extra: list[str], match: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GHOFL_DEBUG", "1")
    with pytest.raises(ConfigError, match=match):
        main(["aggregate", *(str(ws / f) for f in files), "--out", "t.ghs", *extra])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_refusal_is_one_line_and_exit_status_2(ws: Path, tmp_path: Path) -> None:
    r = run_cli("aggregate", ws / "c0.ghs", ws / "clip3.ghs", "--out", "t.ghs",
                "--dp-epsilon", "4", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "have different clipping bounds" in r.stderr
    assert not (tmp_path / "t.ghs").exists() and not (tmp_path / "t.privacy.json").exists()


def test_a_public_covariance_prior_built_by_the_cli_is_mixed_in_and_reported(
        ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ghofl covariance-prior writes a public within-class covariance; ghofl aggregate
    --dp-prior auto:<fp> mixes the release's denoised pooled covariance with it and the
    privacy report says so, at the same spent budget; a missing file is one clear error."""
    monkeypatch.setenv("GHOFL_PROJECTION_DIR", str(tmp_path / "public"))
    x, y = gaussian_mixture(11, num_classes=6, dim=D, n=3000, sep=2.0)  # other classes
    np.savez(tmp_path / "public.npz", x=x, y=y)
    rc = main(["covariance-prior", "--embeddings", str(tmp_path / "public.npz"), "--clip",
               str(R), "--no-default"])
    out = capsys.readouterr().out
    assert rc == 0
    found = re.search(rf": {D} x {D} within-class covariance of 3000 samples \(6 classes, rows "
                      r"clipped at 1\), fingerprint ([0-9a-f]{16})", out)
    assert found, out
    fp = found.group(1)
    assert (tmp_path / "public" / f"{fp}.cov.npy").is_file()
    with_prior, without = tmp_path / "p.ghs", tmp_path / "n.ghs"
    _aggregate(ws, with_prior, "--dp-epsilon", "1", "--dp-prior", f"auto:{fp}", "--seed", "5",
               capsys=capsys)
    _aggregate(ws, without, "--dp-epsilon", "1", "--dp-prior", "none", "--seed", "5",
               capsys=capsys)
    rep = json.loads(privacy_report_path(with_prior).read_text())["privacy"]
    base = json.loads(privacy_report_path(without).read_text())["privacy"]
    assert rep["prior"] == f"auto:{fp}" and base["prior"] == "none"
    assert (rep["epsilon_spent"], rep["sigma"]) == (base["epsilon_spent"], base["sigma"])
    mixed = [n for n in rep["postprocessing"] if "mixed with the public covariance" in n]
    assert len(mixed) == 1 and fp in mixed[0]
    assert "no public covariance prior (DP prior: none)" in base["postprocessing"]
    np.testing.assert_array_equal(load_stats(with_prior).sums, load_stats(without).sums)
    rc = main(["aggregate", *(str(ws / f) for f in FILES), "--out", str(tmp_path / "x.ghs"),
               "--dp-epsilon", "1", "--dp-prior", "auto:00000000deadbeef"])
    assert rc == 2
    assert "no public covariance with fingerprint 00000000deadbeef" in capsys.readouterr().err
    assert not (tmp_path / "x.ghs").exists()


def test_covariance_prior_clips_at_the_encoders_dp_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --clip, embeddings that record EfficientNet-Lite0 at 224 px are clipped at its
    bound for DP (R = 17), the bound its DP clients clip at; --clip overrides it; a negative
    --clip is one clear error."""
    from ghofl.client.encoders.clipping import MEASURED_WEIGHTS
    from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing
    from ghofl.client.local_data import ENCODER_KEY
    from ghofl.stats import EncoderInfo

    monkeypatch.setenv("GHOFL_PROJECTION_DIR", str(tmp_path / "public"))
    info = EncoderInfo("efficientnet-lite0", LITE_DIM, MEASURED_WEIGHTS["efficientnet-lite0"],
                       lite_preprocessing(224), 224)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(2), 30)
    x = rng.standard_normal((y.size, LITE_DIM))
    np.savez(tmp_path / "public.npz", x=x, y=y,
             **{ENCODER_KEY: np.asarray(json.dumps(info.to_dict()))})
    assert main(["covariance-prior", "--embeddings", str(tmp_path / "public.npz")]) == 0
    assert "rows clipped at 17), fingerprint" in capsys.readouterr().out
    assert main(["covariance-prior", "--embeddings", str(tmp_path / "public.npz"), "--clip",
                 "28", "--no-default"]) == 0
    assert "rows clipped at 28), fingerprint" in capsys.readouterr().out
    assert main(["covariance-prior", "--embeddings", str(tmp_path / "public.npz"), "--clip",
                 "-1"]) == 2
    assert re.search(r"--clip must be positive, or 0 for the encoder's bound; got -1\.0$",
                     capsys.readouterr().err.strip())
