"""bench_dp_anchors: resumable parts and a section rendered from whatever parts exist."""

from __future__ import annotations

import json
import re
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ghofl.bench import harness
from ghofl.bench.harness import BenchmarkError
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_dp_anchors.py"


def _bench() -> Any:
    return load_script(SCRIPT, "_dp_anchors_parts")


def _modes() -> Any:
    return load_script(SCRIPT.with_name("_dp_modes.py"), "_dp_modes_parts")


def _part(eps: float, seed: int, shift: float) -> dict[str, Any]:
    heads = {"lda": 0.70 + shift, "ridge": 0.69 + shift, "ncm": 0.65}
    probe = {"accuracy": 0.71, "default_accuracy": 0.69, "eps_search": 1.4 * eps}
    return {"dataset": "cifar10", "epsilon": eps, "seed": seed, "upload": "pooled-k0",
            "date": "2026-12-06", "machine": "test", "seconds": {"dpsgd": 60.0},
            "methods": {"dpsgd": probe, "dpsgd_default": {"accuracy": 0.69},
                        "dpsgd_search": {**probe, "accuracy": 0.66 + shift, "eps_search": eps},
                        "dp_nb": {"accuracy": 0.2}, "dp_lr": {"accuracy": 0.15},
                        "ghofl/central": {"clients": 10, "heads": heads},
                        "ghofl/distributed/10": {"clients": 10, "heads": heads}}}


def _lite_features(b: Any, monkeypatch: pytest.MonkeyPatch, clip: float) -> Any:
    """Fake features of EfficientNet-Lite0 at 224 px given to ``b`` at bound ``clip``, and no
    public basis."""
    from ghofl.client.encoders.clipping import MEASURED_WEIGHTS
    from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing
    from ghofl.stats import EncoderInfo

    info = EncoderInfo("efficientnet-lite0", LITE_DIM, MEASURED_WEIGHTS["efficientnet-lite0"],
                       lite_preprocessing(224), 224)
    feats = SimpleNamespace(y_train=[0] * 4, y_test=[0] * 2, encoder_name="fake",
                            encoder_info=info)
    monkeypatch.setattr(b, "_features", lambda *a: (feats, clip))
    monkeypatch.setattr(b, "public_basis", lambda *a: None)
    return feats


def test_part_names_and_load_from_the_folder(tmp_path: Path) -> None:
    b = _bench()
    assert b.part_name("trec", 0.5, 3) == "trec-eps0.5-seed3.json"
    assert b.part_name("trec", None, None) == "trec-reference.json"
    (tmp_path / "README.md").write_text("not a part")
    (tmp_path / b.part_name("cifar10", 8.0, 0)).write_text(json.dumps(_part(8.0, 0, 0.0)))
    assert list(b.load_parts(tmp_path)["parts"]) == ["cifar10-eps8-seed0.json"]


def test_section_renders_mean_se_and_decided_verdicts() -> None:
    b = _bench()
    parts = {b.part_name("cifar10", 8.0, s): _part(8.0, s, 0.01 * s) for s in range(5)}
    ref = {"dataset": "cifar10", "reference": True, "seconds": {},
           "methods": {"nb": 0.68, "lr": 0.74, "dp_nb_large": 0.67, "dp_lr_large": 0.73,
                       "ghofl/nodp": {"lda": 0.73, "ridge": 0.72, "ncm": 0.66}}}
    text = b.render({"parts": {**parts, "cifar10-reference.json": ref}})
    assert "72.0 ± 0.7 (lda)" in text  # best central head, mean ± se over 5 seeds
    assert "vs DP-SGD tuned, search ε +4.0 ± 1.0 pt: at or above" in text
    assert "| 8 | 10 | 5 / 5 | +0.0 ± 1.0 pt: within 0.5 | +0.0 ± 0.0 pt: within 0.5 |" in text
    assert "vs lda without DP (73.0) -1.0 ± 0.7 pt: within 2" in text
    assert "GaussianNB 67.0 (scikit-learn's non-private GaussianNB 68.0)" in text
    assert "| 8 | 5 | 68.0 ± 0.7 | 71.0 ± 0.0 |" in text and "| 11.20 |" in text


def test_section_renders_without_parts_and_with_one_seed() -> None:
    b = _bench()
    assert "0 parts" in b.render({"parts": {}})
    one = b.render({"parts": {"x": _part(2.0, 0, 0.0)}, "quick": True})
    assert "undecided (< 2 seeds)" in one and "(--quick)" in one


def _modes_part(eps: float, block: tuple[int, int], shift: float) -> dict[str, Any]:
    runs = {str(s): {"ghofl/central": {"clients": 10, "heads": {"lda": 0.70, "ncm": 0.65}},
                     "ghofl/distributed/10": {"clients": 10,
                                              "heads": {"lda": 0.70 + shift, "ncm": 0.65}}}
            for s in range(block[0], block[1] + 1)}
    return {"dataset": "cifar10", "epsilon": eps, "modes": True, "seeds": list(block),
            "clients": [10], "runs": runs, "seconds": {"ghofl/central": 3.0}}


def test_mode_seed_is_deterministic_and_differs_per_seed_and_epsilon() -> None:
    m = _modes()
    seeds = {(s, e): m.mode_seed(s, e) for s in range(6) for e in (0.5, 1.0, 2.0, 4.0, 8.0)}
    assert len(set(seeds.values())) == len(seeds)  # 30 different simulation seeds
    assert seeds[(3, 8.0)] == m.mode_seed(3, 8.0) and 0 <= seeds[(3, 8.0)] < 2**32
    assert m.mode_seed(3, 8.0) not in range(6)  # not a full part's simulation seed


def test_mode_seed_blocks_parse_and_name_parts() -> None:
    m = _modes()
    assert m.parse_seed_block("40-79") == (40, 79) and m.parse_seed_block(" 7-7 ") == (7, 7)
    assert m.modes_part_name("trec", 0.5, (5, 24)) == "trec-eps0.5-modes-s5-24.json"
    for bad in ("40-", "b-a", "9-3", "-3", "4"):
        with pytest.raises(BenchmarkError, match=r"--mode-seeds takes a block of seeds 'A-B' "
                           r"with 0 <= A <= B .* got '" + re.escape(bad) + "'"):
            m.parse_seed_block(bad)


def test_quick_and_mode_seeds_do_not_combine() -> None:
    b = _bench()
    ctx = SimpleNamespace(args=Namespace(quick=True, mode_seeds="0-3"))
    with pytest.raises(BenchmarkError, match="--quick and --mode-seeds do not combine"):
        b.measure(ctx)


def test_modes_parts_pool_with_full_parts_for_the_mode_verdict_only() -> None:
    b, m = _bench(), _modes()
    full = {b.part_name("cifar10", 8.0, s): _part(8.0, s, 0.01 * s) for s in range(5)}
    modes = {m.modes_part_name("cifar10", 8.0, (5, 14)): _modes_part(8.0, (5, 14), 0.002),
             # seeds 10-14 again: the same runs, counted once
             m.modes_part_name("cifar10", 8.0, (10, 19)): _modes_part(8.0, (10, 19), 0.002)}
    text = b.render({"parts": {**full, **modes}})
    # anchors: the 5 full parts only (their central lda 72.0 ± 0.7, not pooled with 0.70)
    assert "| 8 | 5 | 68.0 ± 0.7 |" in text and "72.0 ± 0.7 (lda)" in text
    # ghofl pooled: 5 full + 15 modes seeds (5-19)
    assert "| 8 | central | 20 | 70.5 ± 0.3 | 65.0 ± 0.0 | 71.0 ± 0.7 |" in text
    assert "| 8 | 10 | 20 / 20 | +0.1 ± 0.4 pt: within 0.5 | +0.0 ± 0.0 pt: within 0.5 |" in text
    assert "3 of 3 decided (ε, K, head) cells" in text  # ridge: only the full parts' 5 seeds
    assert "7 parts (2 of them ghofl-only modes parts)" in text
    assert "SeedSequence([seed, round(1000 ε)])" in text and "not independent" in text


def test_modes_verdict_fails_a_distributed_far_from_central() -> None:
    b, m = _bench(), _modes()
    modes = {m.modes_part_name("cifar10", 2.0, (0, 9)): _modes_part(2.0, (0, 9), 0.02)}
    text = b.render({"parts": modes})
    assert "| 2 | 10 | 10 / 10 | +2.0 ± 0.0 pt: NOT within 0.5 |" in text
    assert "(no full ε part yet)" in text and "1 of 2 decided" in text


def test_run_modes_seeds_every_run_from_seed_and_epsilon() -> None:
    m = _modes()
    calls: list[tuple[str, int, int]] = []

    def run(noise: str, k: int, seed: int) -> dict[str, float]:
        calls.append((noise, k, seed))
        return {"lda": 0.5 + k / 1000}

    part = m.run_modes(run, "trec", 4.0, (3, 4), [10, 100], lambda _: None)
    assert sorted(part["runs"]) == ["3", "4"] and part["modes"] and part["clients"] == [10, 100]
    s3 = m.mode_seed(3, 4.0)
    assert calls[:3] == [("central", 10, s3), ("distributed", 10, s3), ("distributed", 100, s3)]
    assert {c[2] for c in calls[3:]} == {m.mode_seed(4, 4.0)}
    assert part["runs"]["3"]["ghofl/distributed/100"] == {"clients": 100, "server_seed": s3,
                                                          "heads": {"lda": 0.6}}


def test_measure_modes_writes_one_part_per_epsilon_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b, m = _bench(), _modes()
    feats = SimpleNamespace(y_train=[0] * 4, y_test=[0] * 2, encoder_name="fake")
    monkeypatch.setattr(b, "_features", lambda *a: (feats, 1.0))
    seen: list[int] = []

    def ghofl(f: Any, clip: float, upload: Any, dp: Any, k: int, seed: int) -> dict[str, float]:
        seen.append(seed)
        return {"lda": 0.8 if dp.mode == "central" else 0.81}

    monkeypatch.setattr(b, "_ghofl", ghofl)
    monkeypatch.setattr(b, "public_basis", lambda *a: None)
    args = Namespace(quick=False, mode_seeds="2-3", mode="pooled", projection=0, clients="10",
                     epsilons="1,8", datasets="trec", fresh=False, no_write=False,
                     subspace="auto", prior="auto", ghofl_only=False, dp_clip_runs=False,
                     clip="dp")
    ctx = harness.Context(root=tmp_path, args=args, out=tmp_path / "B.md")
    out = b.measure(ctx)["dp_anchors"]["parts"]
    folder = tmp_path / "benchmarks" / "results" / "dp_anchors"
    assert sorted(p.name for p in folder.glob("*.json")) == sorted(out) == [
        "trec-eps1-modes-s2-3.json", "trec-eps8-modes-s2-3.json"]
    # without a public basis the default rule runs as "auto" (the whole space)
    assert {(p["subspace"], p["prior"], p["public_basis"]) for p in out.values()} == {
        ("auto", "auto", None)}
    assert len(seen) == 8 and set(seen) == {m.mode_seed(s, e) for s in (2, 3) for e in (1, 8)}
    b.measure(ctx)  # resumes: both parts exist, nothing runs
    assert len(seen) == 8


def test_ghofl_only_measures_ghofl_again_and_keeps_the_anchors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = _bench()
    feats = SimpleNamespace(y_train=[0] * 4, y_test=[0] * 2, encoder_name="fake")
    monkeypatch.setattr(b, "_features", lambda *a: (feats, 1.0))
    basis = {"fingerprint": "0123456789abcdef", "source": "public train (9 rows)",
             "covariance": "fedcba9876543210"}
    monkeypatch.setattr(b, "public_basis", lambda *a: basis)
    seen: list[str] = []

    def ghofl(f: Any, clip: float, upload: Any, dp: Any, k: int, seed: int,
              choice: list[dict[str, Any]] | None = None) -> dict[str, float]:
        seen.append(f"{dp.subspace} {dp.prior}")
        if choice is not None:
            choice.append({"k": 2, "ratio": 0.3, "note": "fitted in the first 2 ...",
                           "prior": {"fingerprint": "fedcba9876543210", "weight": 0.4}})
        return {"lda": 0.9}

    monkeypatch.setattr(b, "_ghofl", ghofl)
    folder = tmp_path / "benchmarks" / "results" / "dp_anchors"
    old = {"dataset": "cifar10", "epsilon": 1.0, "seed": 0, "code": {"commit": "aaaaaaaaaaaa"},
           "date": "2026-12-01", "methods": {"dpsgd": {"accuracy": 0.7},
                                             "ghofl/central": {"clients": 10,
                                                               "heads": {"lda": 0.5}}},
           "seconds": {"dpsgd": 9.0, "ghofl/central": 1.0}}
    folder.mkdir(parents=True)
    (folder / "cifar10-eps1-seed0.json").write_text(json.dumps(old))
    args = Namespace(quick=False, mode_seeds="", mode="pooled", projection=0, clients="10",
                     epsilons="1,2", seeds="0", datasets="cifar10", fresh=False, no_write=False,
                     subspace="auto", prior="auto", ghofl_only=True, dp_clip_runs=False,
                     clip="dp")
    ctx = harness.Context(root=tmp_path, args=args, out=tmp_path / "B.md")
    parts = b.measure(ctx)["dp_anchors"]["parts"]
    assert sorted(parts) == ["cifar10-eps1-seed0.json"]  # no new part, no reference
    new = json.loads((folder / "cifar10-eps1-seed0.json").read_text())
    assert new["methods"]["dpsgd"] == {"accuracy": 0.7} and new["seconds"]["dpsgd"] == 9.0
    assert new["methods"]["ghofl/central"]["heads"] == {"lda": 0.9}
    assert new["methods"]["ghofl/central"]["subspace"]["k"] == 2
    assert new["anchors_code"] == {"commit": "aaaaaaaaaaaa"} and new["date"] == "2026-12-01"
    assert new["public_basis"] == basis and new["subspace"] == "auto:0123456789abcdef"
    assert new["prior"] == "auto:fedcba9876543210"
    assert set(seen) == {"auto:0123456789abcdef auto:fedcba9876543210"} and len(seen) == 2
    text = b.render({"parts": parts})
    # the earlier run (whole space, no prior) kept beside the new one, in both columns
    assert "| k = 2 (ρ 0.3) | b 0.40 | 50.0 (lda) | 50.0 (lda) |" in text
    assert new["methods"]["ghofl/central@whole"]["heads"] == {"lda": 0.5}
    assert new["methods"]["ghofl/central@noprior"]["heads"] == {"lda": 0.5}
    assert "| 1 | central | 1 | 90.0 |" in text  # the ghofl tables show only the new runs
    assert "cifar10: basis `0123456789abcdef`, covariance `fedcba9876543210` from public " \
        "train (9 rows)" in text
    assert "ghofl's runs of 1 full parts measured again (`--ghofl-only`" in text


def test_subspace_choice_reads_the_release_notes(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from ghofl.privacy.subspace import choose_subspace
    from ghofl.stats.meta import StatsMeta
    from ghofl.stats.projection import BASIS_DIR_ENV, load_basis, pca_basis, save_basis

    b = _bench()
    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path))
    _, fp = save_basis(pca_basis(np.random.default_rng(0).standard_normal((50, 10)), 10))
    meta = StatsMeta("pooled", 10, ("a", "b"), clip_norm=1.0)
    k_note = choose_subspace(f"auto:{fp}", meta, {"scatter": 30.0}, 102.0).reason
    whole = choose_subspace(f"auto:{fp}", meta, {"scatter": 0.5}, 102.0).reason
    no_basis = choose_subspace("auto", meta, {"scatter": 30.0}, 102.0).reason
    assert b.subspace_choice(["counts rounded", k_note]) == {"k": 4, "ratio": 3.0,
                                                            "capture": None, "note": k_note}
    assert b.subspace_choice([whole])["k"] is None
    assert b.subspace_choice([whole])["ratio"] == pytest.approx(0.05)
    assert b.subspace_choice([no_basis]) == {"k": None, "ratio": 3.0, "capture": None,
                                             "note": no_basis}
    n = np.array([51.0, 51.0])
    v = load_basis(fp)
    first, last = 51.0 * v[:, 0], 51.0 * v[:, 9]
    sums = np.stack([-first + last, first - last])  # half the separation kept
    missed = choose_subspace(f"auto:{fp}", meta, {"scatter": 30.0, "sums": 1.0}, 102.0,
                             sums, n).reason
    got = b.subspace_choice([missed])
    assert got["k"] is None and got["capture"][1] <= got["capture"][0] < 0.9
    sums = np.stack([-first, first])  # all of it
    kept = b.subspace_choice([choose_subspace(f"auto:{fp}", meta,
                                              {"scatter": 30.0, "sums": 1.0}, 102.0, sums,
                                              n).reason])
    assert kept["k"] == 4 and kept["capture"][1] <= kept["capture"][0]
    assert b.subspace_cell([got, got]) == (
        f"whole (ρ 3; basis keeps {got['capture'][0]:.2f}, bound {got['capture'][1]:.2f})")
    assert b.subspace_choice(["counts rounded"]) is None
    assert b.subspace_cell([]) == "–"
    assert b.subspace_cell([None, None]) == "whole (no rule recorded)"
    assert b.subspace_cell([{"k": None, "ratio": 0.08}, {"k": None, "ratio": 0.1}]) == \
        "whole (ρ 0.09)"


def test_prior_choice_reads_the_release_notes() -> None:
    """The weight column parses the note the post-processing writes (P3p)."""
    import numpy as np

    from ghofl.privacy.postprocess import _within
    from ghofl.privacy.prior import PriorChoice

    b = _bench()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 5))
    w = 300.0 * (a @ a.T)
    notes: list[str] = []
    _within(w, np.array([100.0, 110.0, 120.0]), np.ones(3, dtype=bool),
            {"sums": 1.0, "scatter": 400.0}, notes,
            PriorChoice(np.eye(5), "fedcba9876543210", ""))
    got = b.prior_choice(notes)
    assert got is not None and got["fingerprint"] == "fedcba9876543210"
    assert 0.0 <= got["weight"] <= 1.0
    assert b.prior_choice(["counts rounded"]) is None
    assert b.prior_cell([{"prior": got}, {"prior": None}]) == \
        f"b {got['weight']:.2f} (1 of 2 seeds)"
    assert b.prior_cell([{"prior": None}]) == "none"
    assert b.prior_cell([{"k": 2}]) == "none (no prior recorded)"


def test_dp_clip_runs_add_ghofl_at_the_dp_bound_and_keep_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--dp-clip-runs adds central and 10-client distributed runs (and the reference's run
    without DP) at the encoder's DP bound to the existing parts, keeps everything else, and
    the section shows them in their own columns and verdict lines."""
    b = _bench()
    _lite_features(b, monkeypatch, 28.0)
    seen: list[tuple[float, str | None]] = []

    def ghofl(f: Any, clip: float, upload: Any, dp: Any, k: int, seed: int,
              choice: list[dict[str, Any]] | None = None) -> dict[str, float]:
        seen.append((clip, None if dp is None else dp.mode))
        return {"lda": 0.75 if dp is not None else 0.80}

    monkeypatch.setattr(b, "_ghofl", ghofl)
    folder = tmp_path / "benchmarks" / "results" / "dp_anchors"
    folder.mkdir(parents=True)
    for eps in (1.0, 8.0):
        for seed in (0, 1):
            (folder / b.part_name("cifar10", eps, seed)).write_text(
                json.dumps(_part(eps, seed, 0.01 * seed)))
    ref = {"dataset": "cifar10", "reference": True, "seconds": {},
           "methods": {"nb": 0.7, "lr": 0.79, "dp_nb_large": 0.7, "dp_lr_large": 0.78,
                       "ghofl/nodp": {"lda": 0.798, "ridge": 0.799}}}
    (folder / "cifar10-reference.json").write_text(json.dumps(ref))
    args = Namespace(quick=False, mode_seeds="", mode="pooled", projection=0, clients="10",
                     epsilons="1,8", seeds="0,1", datasets="cifar10", fresh=False,
                     no_write=False, subspace="auto", prior="auto", ghofl_only=False,
                     dp_clip_runs=True, clip="dp")
    ctx = harness.Context(root=tmp_path, args=args, out=tmp_path / "B.md")
    parts = b.measure(ctx)["dp_anchors"]["parts"]
    assert set(seen) == {(17.0, "central"), (17.0, "distributed"), (17.0, None)}
    assert len(seen) == 4 * 2 + 1
    one = json.loads((folder / "cifar10-eps8-seed0.json").read_text())
    assert one["methods"]["ghofl/central@dpclip"] == {"clients": 10, "clip": 17.0,
                                                     "heads": {"lda": 0.75}, "subspace": None}
    assert one["methods"]["ghofl/central"] == _part(8.0, 0, 0.0)["methods"]["ghofl/central"]
    assert one["dp_clip"]["clip"] == 17.0
    text = b.render({"parts": parts})
    assert "ghofl central at the DP clip (same seeds) | distributed/10 at the DP clip |" in text
    assert "at the DP clip R = 17: lda 80.0" in text
    assert "- cifar10, ε = 8: at the DP clip, best ghofl central head lda (75.0 ± 0.0 %)" in text
    assert "vs lda without DP (80.0) -5.0" in text
    b.measure(ctx)  # resumes: every part has its runs
    assert len(seen) == 9


def test_a_part_measured_again_at_another_bound_keeps_the_earlier_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--fresh at a new clipping bound: the part it replaces (another clip) is kept as
    "earlier" and shown in the columns *at R = 28*; the modes parts at the old bound are not
    pooled; --ghofl-only refuses to mix two bounds in one part."""
    b = _bench()
    feats = _lite_features(b, monkeypatch, 17.0)

    def part(f: Any, clip: float, eps: float, seed: int, *a: Any) -> dict[str, Any]:
        new = _part(eps, seed, 0.05)
        return {k: new[k] for k in ("dataset", "epsilon", "seed", "methods", "seconds")}

    def reference(f: Any, clip: float, *a: Any) -> dict[str, Any]:
        return {"dataset": "cifar10", "reference": True, "seconds": {},
                "methods": {"nb": 0.7, "lr": 0.79, "dp_nb_large": 0.7, "dp_lr_large": 0.78,
                            "ghofl/nodp": {"lda": 0.80}}}

    monkeypatch.setattr(b, "run_part", part)
    monkeypatch.setattr(b, "run_reference", reference)
    folder = tmp_path / "benchmarks" / "results" / "dp_anchors"
    folder.mkdir(parents=True)
    for seed in (0, 1):
        (folder / b.part_name("cifar10", 8.0, seed)).write_text(
            json.dumps({**_part(8.0, seed, 0.0), "clip": 28.0}))
    (folder / "cifar10-reference.json").write_text(json.dumps(
        {**reference(None, 28.0), "clip": 28.0, "methods": {
            **reference(None, 28.0)["methods"], "ghofl/nodp": {"lda": 0.79}}}))
    modes = {"dataset": "cifar10", "epsilon": 8.0, "modes": True, "seeds": [5, 5],
             "clients": [10], "clip": 28.0, "seconds": {}, "runs": {"5": {
                 "ghofl/central": {"clients": 10, "heads": {"lda": 0.1}}}}}
    (folder / "cifar10-eps8-modes-s5-5.json").write_text(json.dumps(modes))
    args = Namespace(quick=False, mode_seeds="", mode="pooled", projection=0, clients="10",
                     epsilons="8", seeds="0,1", datasets="cifar10", fresh=True,
                     no_write=False, subspace="auto", prior="auto", ghofl_only=False,
                     dp_clip_runs=False, clip="dp")
    ctx = harness.Context(root=tmp_path, args=args, out=tmp_path / "B.md")
    parts = b.measure(ctx)["dp_anchors"]["parts"]
    one = json.loads((folder / "cifar10-eps8-seed0.json").read_text())
    assert one["clip"] == 17.0 and one["earlier"]["clip"] == 28.0
    assert one["earlier"]["methods"] == _part(8.0, 0, 0.0)["methods"]
    assert one["methods"]["ghofl/central"]["heads"]["lda"] == pytest.approx(0.75)
    text = b.render({"parts": parts})
    assert ("| ghofl central at R = 28 (same seeds) | DP-SGD tuned, search ε, at R = 28 "
            "(same seeds) |") in text
    assert "| 75.0 ± 0.0 (lda) | whole (no rule recorded) | none (no prior recorded) | " \
        "70.0 ± 0.0 (lda) | 66.0 ± 0.0 |" in text
    assert "ghofl without DP at R = 17: lda 80.0 (at R = 28: lda 79.0)" in text
    assert "| 8 | central | 2 | 75.0 ± 0.0 |" in text  # the modes run at R = 28 is left out
    b.measure(ctx)  # measured again at the same bound: the earlier runs stay
    assert json.loads((folder / "cifar10-eps8-seed0.json").read_text())["earlier"] == one[
        "earlier"]
    ctx.args.ghofl_only, ctx.args.fresh = True, False
    monkeypatch.setattr(b, "_features", lambda *a: (feats, 28.0))
    with pytest.raises(b.harness.BenchmarkError,
                       match=r"^cifar10-eps8-seed0.json clipped its anchors at R = 17, this "
                             r"--clip gives R = 28: --ghofl-only would mix the two bounds in "
                             r"one part; pass --clip dp$"):
        b.measure(ctx)
    # parts at another bound (the reference's is 17: this one and the modes part) are left
    # out of the tables, and counted
    (folder / "cifar10-eps8-seed2.json").write_text(json.dumps(
        {**_part(8.0, 2, 0.2), "clip": 28.0}))
    text = b.render(b.load_parts(folder))
    assert "2 parts of cifar10 clipped at another bound than its reference part are left " \
        "out of its tables." in text
    assert "| 8 | central | 2 | 75.0 ± 0.0 |" in text
