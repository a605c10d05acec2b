"""``ghofl simulate`` with differential privacy: options, JSON output, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli, write_npz

pytest.importorskip("dp_accounting")


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    w = tmp_path_factory.mktemp("dpws")
    x, y = gaussian_mixture(5, num_classes=3, dim=5, n=460, sep=3.0)
    write_npz(w / "train.npz", x[:400], y[:400])
    write_npz(w / "test.npz", x[400:], y[400:])
    return w


def _sim(ws: Path, tmp_path: Path, *extra: str) -> tuple[dict[str, object], str]:
    r = run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "4", "--alpha", "1", "--heads", "nb,lda,qda", "--json", "o.json",
                *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / "o.json").read_text()), r.stdout


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_simulate_reports_the_spent_budget(ws: Path, tmp_path: Path, mode: str) -> None:
    res, out = _sim(ws, tmp_path, "--dp-epsilon", "4", "--dp-delta", "1e-6", "--clip", "20",
                    "--secure", "--dp-mode", mode)
    p = res["privacy"]
    assert isinstance(p, dict)
    assert p["dp_mode"] == mode and p["epsilon_spent"] == 4.0
    assert p["delta_spent"] == pytest.approx(1e-6, rel=1e-6)
    assert p["min_class_count"] == 5 and res["min_class_count"] == 5  # the DP default
    # applied by the server to the noised counts: no client drops a class, no multiplier
    assert res["suppressed"]["classes"] == 0  # type: ignore[index]
    assert p["sensitivity"] == {"counts": 1.0, "sums": 20.0, "class_scatter": 400.0}
    if mode == "distributed":  # every level removed: the kept noise is the central noise
        noise = p["distributed_noise"]
        assert noise["kept_variance"] == pytest.approx(1.0, rel=1e-12)
        assert noise["removed_per_level"] == [noise["survivors"]] * len(noise["release_points"])
    else:
        assert "distributed_noise" not in p
    assert any("P2n" in n for n in p["postprocessing"])  # the noise-aware estimate
    assert f"differential privacy ({mode}): spent epsilon=4, delta=1e-06" in out
    assert "post-processing: counts rounded and clamped at 0" in out
    for head in res["heads"].values():  # type: ignore[attr-defined]
        assert 0.0 <= head["accuracy"] <= 1.0


def test_the_budget_split_is_chosen_from_the_training_set_unless_told(ws: Path,
                                                                     tmp_path: Path) -> None:
    common = ("--dp-epsilon", "4", "--clip", "20")
    auto, _ = _sim(ws, tmp_path, *common)
    p = auto["privacy"]
    assert isinstance(p, dict) and p["budget_split"] == "auto"
    assert p["expected_samples"] == 400  # the training set's size
    assert p["fractions"]["class_scatter"] > p["fractions"]["sums"] > p["fractions"]["counts"]
    equal, _ = _sim(ws, tmp_path, *common, "--dp-split", "equal")
    q = equal["privacy"]
    assert isinstance(q, dict) and q["budget_split"] == "equal"
    assert list(q["fractions"].values()) == pytest.approx([1 / 3] * 3)
    told, _ = _sim(ws, tmp_path, *common, "--dp-expected-samples", "40")
    r = told["privacy"]
    assert isinstance(r, dict) and r["expected_samples"] == 40
    assert r["fractions"] != p["fractions"]


def test_simulate_without_dp_keeps_every_class(ws: Path, tmp_path: Path) -> None:
    res, _ = _sim(ws, tmp_path)
    assert res["privacy"] is None and res["min_class_count"] == 1
    res, out = _sim(ws, tmp_path, "--min-class-count", "20")
    assert res["min_class_count"] == 20 and res["suppressed"]["classes"] > 0  # type: ignore[index]
    assert "minimum-count rule (k=20)" in out


W = "<ws>"
BASE = ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz", "--clients", "3",
        "--alpha", "1"]
BAD = [
    ("distributed-without-secure", [*BASE, "--dp-epsilon", "1", "--clip", "5", "--dp-mode",
                                    "distributed"],
     r"--dp-mode distributed adds each client's noise share before secure aggregation, so it "
     r"needs --secure"),
    ("epsilon-zero", [*BASE, "--dp-epsilon", "0", "--clip", "5"],
     r"the privacy budget epsilon must be a finite number > 0; got 0\.0"),
    ("delta-one", [*BASE, "--dp-epsilon", "1", "--dp-delta", "1", "--clip", "5"],
     r"delta must be a number strictly between 0 and 1"),
    ("bad-mode", [*BASE, "--dp-epsilon", "1", "--clip", "5", "--dp-mode", "local"],
     r"--dp-mode must be one of central, distributed; got 'local'"),
    ("bad-split", [*BASE, "--dp-epsilon", "1", "--clip", "5", "--dp-split", "thirds"],
     r"--dp-split must be one of auto, equal; got 'thirds'"),
    ("split-without-epsilon", [*BASE, "--dp-split", "equal"], r"--dp-split needs --dp-epsilon"),
    ("delta-without-epsilon", [*BASE, "--dp-delta", "1e-5"],
     r"--dp-delta needs --dp-epsilon"),
    ("dp-without-clip", [*BASE, "--dp-epsilon", "1"],
     r"--dp-epsilon needs --clip R: .* the sensitivity of the statistics depends on it"),
    ("min-count-zero", [*BASE, "--min-class-count", "0"],
     r"--min-class-count must be at least 1 \(1 keeps every class\); got 0"),
]


@pytest.mark.parametrize(("args", "pattern"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_dp_options_fail_with_one_clear_line(ws: Path, tmp_path: Path, args: list[str],
                                                  pattern: str) -> None:
    r = run_cli(*[a.replace(W, str(ws)) for a in args], cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), r.stderr


def test_noise_is_seeded_by_the_simulation_seed(ws: Path, tmp_path: Path) -> None:
    a, _ = _sim(ws, tmp_path, "--dp-epsilon", "1", "--clip", "20", "--seed", "3")
    b, _ = _sim(ws, tmp_path, "--dp-epsilon", "1", "--clip", "20", "--seed", "3")
    assert a["heads"] == b["heads"] or all(  # fit times differ; accuracies do not
        a["heads"][h]["accuracy"] == b["heads"][h]["accuracy"]  # type: ignore[index]
        for h in ("nb", "lda", "qda"))
    assert np.isfinite(a["privacy"]["noise_multiplier"])  # type: ignore[index]


def test_dp_without_clip_takes_the_recorded_encoders_dp_bound(tmp_path: Path) -> None:
    """Embeddings that record EfficientNet-Lite0 at 224 px: --dp-epsilon without --clip clips
    at its DP bound (R = 17, stated), --secure alone at its default bound (28), and --clip
    overrides both."""
    from ghofl.client.encoders.clipping import MEASURED_WEIGHTS
    from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing
    from ghofl.client.local_data import ENCODER_KEY
    from ghofl.stats import EncoderInfo

    info = EncoderInfo("efficientnet-lite0", LITE_DIM, MEASURED_WEIGHTS["efficientnet-lite0"],
                       lite_preprocessing(224), 224)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = (rng.standard_normal((y.size, LITE_DIM)) * 0.5 + y[:, None]).astype(np.float32)
    record = {ENCODER_KEY: np.asarray(json.dumps(info.to_dict()))}
    np.savez(tmp_path / "train.npz", x=x, y=y, **record)
    np.savez(tmp_path / "test.npz", x=x[::2], y=y[::2], **record)
    env = {"GHOFL_PROJECTION_DIR": str(tmp_path / "public")}

    def sim(*extra: str) -> tuple[dict[str, object], str]:
        r = run_cli("simulate", "--train", "train.npz", "--test", "test.npz", "--clients",
                    "3", "--alpha", "1", "--mode", "diag", "--heads", "ncm,nb", "--json",
                    "o.json", *extra, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads((tmp_path / "o.json").read_text()), r.stdout

    res, out = sim("--dp-epsilon", "4")
    assert res["clip_norm"] == 17.0
    assert ("clipping bound R=17: encoder efficientnet-lite0's bound for differential privacy"
            " (the median norm of public embeddings") in out
    res, out = sim("--secure")
    assert res["clip_norm"] == 28.0 and "clipping bound R=28: encoder efficientnet-lite0's " \
        "default bound" in out
    res, out = sim("--dp-epsilon", "4", "--clip", "9")
    assert res["clip_norm"] == 9.0 and "encoder efficientnet-lite0's" not in out
