"""Every front end on the one server path (ghofl.server.run.FederationServer).

``ghofl aggregate`` runs the plain server over payload files (ghofl.server.files), ``ghofl fit``
fits through the server from a total, a simulated run builds its heads and calibrates its
noise once, and a loaded model applies its own recorded feature transform to raw embeddings.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ghofl.heads.build
import ghofl.privacy
import ghofl.server.job
import ghofl.server.simulation
from ghofl.cli.main import main
from ghofl.client.job import ClientJob, client_statistics
from ghofl.client.transforms import apply_feature_transform
from ghofl.errors import ConfigError, InputError, UnsupportedModeError
from ghofl.model.directory import FittedModel, load_model
from ghofl.privacy import DPConfig
from ghofl.secure import PlainServer, run_aggregation
from ghofl.secure.messages import PROTOCOL_VERSION, ConsistencyRequest
from ghofl.server.files import FilesTransport, payload_plan
from ghofl.server.job import ServerJob, run_server_job
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.run import FederationServer
from ghofl.server.simulation import Population, simulate
from ghofl.stats import (
    ClientStats,
    compute_stats,
    load_stats,
    save_stats,
    sum_stats,
    unflatten_stats,
)
from ghofl.stats.meta import EncoderInfo
from ghofl.stats.schema import schema_for
from ghofl.store import AggregationStore
from tests.helpers import gaussian_mixture

CLASSES = ("a", "b", "c")
D = 6
R = 6.0


def _payloads(n: int, mode: str = "full", clip: float | None = None) -> list[ClientStats]:
    return [compute_stats(*gaussian_mixture(10 + i, 3, D, n=60), CLASSES, mode,  # type: ignore[arg-type]
                          clip_norm=clip) for i in range(n)]


def _write(folder: Path, payloads: list[ClientStats]) -> list[Path]:
    paths = [folder / f"c{i}.ghs" for i in range(len(payloads))]
    for p, s in zip(paths, payloads, strict=True):
        save_stats(s, p)
    return paths


def _poisoned(stats: ClientStats) -> ClientStats:
    """``stats`` plus one unclipped sample of norm 1000·R: valid statistics, beyond the bounds."""
    z = np.full((1, D), 1000.0 * R / math.sqrt(D))
    raw = compute_stats(z, np.zeros(1, np.int64), CLASSES, stats.mode)
    big = unflatten_stats(dataclasses.replace(raw.meta, clip_norm=R),
                          *schema_for(stats.mode).flatten(raw))
    return unflatten_stats(stats.meta, *(
        a + b for a, b in zip(schema_for(stats.mode).flatten(stats),
                              schema_for(stats.mode).flatten(big), strict=True)))


def _cli(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------------- ghofl aggregate
def test_the_files_transport_delivers_each_file_to_the_plain_server(tmp_path: Path) -> None:
    payloads = _payloads(3)
    paths = _write(tmp_path, payloads)
    transport = FilesTransport({p.stem: p for p in paths})
    meta = transport.first_meta()
    server = FederationServer(payload_plan(meta), [p.stem for p in paths], meta)
    out = server.aggregate(transport)
    assert out.report.survivors == ["c0", "c1", "c2"] == transport.delivered
    assert out.total.allclose(sum_stats(payloads), rtol=1e-12)
    assert out.report.stages["input"].server_received_bytes == sum(
        p.stat().st_size for p in paths)


def test_the_files_transport_refuses_what_files_cannot_answer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no payload files to deliver; give at least one"):
        FilesTransport({}).first_meta()
    path = _write(tmp_path, _payloads(1))[0]
    request = ConsistencyRequest(PROTOCOL_VERSION, b"r" * 16, "consistency", ("c0",), ())
    with pytest.raises(ConfigError, match=r"payload files answer only the plain protocol's "
                       r"input request, not a ConsistencyRequest \(stage 'consistency'\)"):
        list(FilesTransport({"c0": path}).exchange("consistency", {"c0": request}))


def test_the_files_transport_stops_when_halted(tmp_path: Path) -> None:
    paths = _write(tmp_path, _payloads(3))
    server = PlainServer([p.stem for p in paths])
    transport = FilesTransport({p.stem: p for p in paths},
                               halt=lambda: len(server.survivors) == 2)
    report = run_aggregation(server, transport)
    assert report.survivors == ["c0", "c1"] and report.dropped == {"c2": "input"}


def test_aggregate_records_through_the_server_and_words_its_refusals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    good = _payloads(3, "full", R)
    _write(tmp_path, good)
    save_stats(_poisoned(good[0]), tmp_path / "bad.ghs")
    save_stats(_payloads(1, "pooled", R)[0], tmp_path / "pooled.ghs")
    rc, out, err = _cli(["aggregate", "--store", "fed.db", "c0.ghs", "c1.ghs"], capsys)
    assert rc == 0, err
    assert re.search(r"^added 'c0' from c0\.ghs: n=60 samples, SHA-256 [0-9a-f]{12}…$", out,
                     re.M)
    assert "store fed.db: 2 contributions, n=120 samples, 3 classes, mode full" in out
    # the server refuses the poisoned payload; the round stops there, c2 is not recorded
    rc, out, err = _cli(["aggregate", "--store", "fed.db", "c1.ghs", "bad.ghs", "c2.ghs"],
                        capsys)
    assert rc == 2 and "'c1' already present with the same payload" in out
    assert re.search(r"cannot record 'bad\.ghs' as client 'bad' in store 'fed\.db': the "
                     r"server refused it: it sent statistics that clipping at R=6 .* cannot "
                     r"produce: .*; the 1 payload\(s\) before it were recorded", err), err
    rc, _, err = _cli(["aggregate", "--store", "fed.db", "c2.ghs", "pooled.ghs"], capsys)
    assert rc == 2 and re.search(
        r"cannot record 'pooled\.ghs' as client 'pooled' in store 'fed\.db': they differ in "
        r"mode \('full' vs 'pooled'\); every payload must come from the same encoder.*; the 1 "
        r"payload\(s\) before it were recorded", err), err
    with AggregationStore(tmp_path / "fed.db") as store:
        assert [c.client_id for c in store.contributions()] == ["c0", "c1", "c2"]
    rc, _, err = _cli(["aggregate", "bad.ghs", "c0.ghs", "--out", "t.ghs"], capsys)
    assert rc == 2 and re.search(r"cannot add 'bad\.ghs' to the total of the files before "
                                 r"it: the server refused it: it sent statistics", err), err
    assert not (tmp_path / "t.ghs").exists()
    rc, out, err = _cli(["aggregate", "c0.ghs", "c1.ghs", "c2.ghs", "--out", "t.ghs"], capsys)
    assert rc == 0, err
    assert load_stats(tmp_path / "t.ghs").allclose(sum_stats(good), rtol=1e-12)


# ---------------------------------------------------------------------- ghofl fit
def test_fit_runs_the_plans_server_job_with_the_preset_merged_by_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    total = sum_stats(_payloads(3))
    save_stats(total, tmp_path / "total.ghs")
    rc, _, err = _cli(["fit", "total.ghs", "--heads", "nb,lda", "--preset", "paper", "--param",
                       "lda.shrinkage=0.2", "--seed", "4", "--out", "m"], capsys)
    assert rc == 0, err
    model = load_model(tmp_path / "m")
    job = ServerJob(("nb", "lda"), {"lda": {"shrinkage": 0.2}}, seed=4, preset="paper")
    direct = run_server_job(total, job)
    for name, head in direct.heads.items():
        assert model.heads[name].get_params() == head.get_params()
    assert model.heads["lda"].get_params()["covariance_divisor"] == "n-c"  # from the preset
    card = (tmp_path / "m" / "MODEL_CARD.md").read_text()
    assert ("ghofl fit total.ghs --heads nb,lda --param lda.shrinkage=0.2 --preset paper "
            "--seed 4 --out m") in card


def test_run_server_job_refuses_heads_that_are_not_the_jobs() -> None:
    total = sum_stats(_payloads(2))
    heads = ghofl.heads.build.build_heads(["nb"])
    with pytest.raises(ConfigError, match=r"heads \['nb'\] are not the job's heads \['nb', "
                       r"'lda'\]; build them from the job"):
        run_server_job(total, ServerJob(("nb", "lda")), heads=heads)


# ---------------------------------------------------------------------- simulation
def test_a_simulated_run_builds_its_heads_and_calibrates_its_noise_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = gaussian_mixture(3, 3, D, n=400)
    counts = {"heads": 0, "noise": 0}
    build, calibrate = ghofl.heads.build.build_heads, ghofl.privacy.plan_noise

    def counted_build(*args: Any, **kw: Any) -> Any:
        counts["heads"] += 1
        return build(*args, **kw)

    def counted_noise(*args: Any, **kw: Any) -> Any:
        counts["noise"] += 1
        return calibrate(*args, **kw)

    for module in (ghofl.heads.build, ghofl.server.job, ghofl.server.simulation):
        monkeypatch.setattr(module, "build_heads", counted_build)
    monkeypatch.setattr(ghofl.privacy, "plan_noise", counted_noise)
    # the whole command: the plan (checked when built, as the CLI builds it), then the run
    plan = FederationPlan(ClientJob(CLASSES, "full", clip_norm=R, min_class_count=1),
                          AggregationSpec("secure", dp=DPConfig(4.0, mode="distributed",
                                                                expected_samples=300)),
                          ServerJob(("nb", "lda")))
    result = simulate(plan, (x[:300], y[:300]), (x[300:], y[300:]), Population(5, 1.0))
    assert result.privacy is not None and set(result.heads) == {"nb", "lda"}
    assert counts == {"heads": 1, "noise": 1}


def test_ghofl_simulate_with_dp_calibrates_its_noise_once_without_a_sample_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI tells the plan the training set's size before building it (no second plan)."""
    from tests.helpers_cli import write_npz

    monkeypatch.chdir(tmp_path)
    x, y = gaussian_mixture(3, 3, D, n=400)
    write_npz(tmp_path / "tr.npz", x[:300], y[:300])
    write_npz(tmp_path / "te.npz", x[300:], y[300:])
    calibrations: list[Any] = []
    calibrate = ghofl.privacy.plan_noise

    def counted(dp: Any, *args: Any, **kw: Any) -> Any:
        calibrations.append(dp.expected_samples)
        return calibrate(dp, *args, **kw)

    monkeypatch.setattr(ghofl.privacy, "plan_noise", counted)
    rc, _, err = _cli(["simulate", "--train", "tr.npz", "--test", "te.npz", "--clients", "3",
                       "--alpha", "1", "--heads", "nb,lda", "--clip", str(R),
                       "--dp-epsilon", "4"], capsys)
    assert rc == 0, err
    assert calibrations == [300]


def test_a_plan_refuses_heads_its_upload_mode_cannot_fit_before_any_client_works() -> None:
    with pytest.raises(UnsupportedModeError, match=r"^head 'qda' needs upload mode 'full' or "
                       r"richer \(full\), but the statistics are mode 'pooled'; compute the "
                       r"client statistics with mode 'full' \(--mode full\) or drop 'qda'"):
        FederationPlan(ClientJob(CLASSES, "pooled"), server=ServerJob(("lda", "qda")))


def test_run_server_job_checks_the_mode_of_heads_built_elsewhere() -> None:
    total = sum_stats(_payloads(2, "pooled"))
    heads = ghofl.heads.build.build_heads(["qda"])
    with pytest.raises(UnsupportedModeError, match=r"^head 'qda' needs upload mode 'full'"):
        run_server_job(total, ServerJob(("qda",)), heads=heads)


# ---------------------------------------------------------------------- the fitted model
def _model_with_transform(tmp_path: Path, transform: str) -> tuple[FittedModel, np.ndarray]:
    x, y = gaussian_mixture(5, 3, D, n=500)
    x = np.abs(x).astype(np.float32)  # the encoder's raw output, as float32 as ONNX gives it
    job = ClientJob(CLASSES, "full", feature_transform=transform)
    stats = client_statistics((x[:400], y[:400]), job, encoder_info=EncoderInfo("toy", D))
    run_server_job(stats, ServerJob(("nb", "lda", "qda")), out_dir=tmp_path / "m")
    return load_model(tmp_path / "m"), x[400:]


def test_the_model_applies_its_recorded_transform_to_raw_embeddings(tmp_path: Path) -> None:
    model, raw = _model_with_transform(tmp_path, "x+sqrt")
    heads, manifest = model  # still unpacks as before
    assert model.transform == "x+sqrt" and manifest["stats"]["dim"] == 2 * D
    by_hand = apply_feature_transform(raw.astype(np.float64), "x+sqrt")  # the old manual path
    y = np.arange(raw.shape[0]) % 3
    for name, head in heads.items():
        np.testing.assert_array_equal(model.predict(raw, name), head.predict(by_hand))
        np.testing.assert_array_equal(model.predict_proba(raw, name),
                                      head.predict_proba(by_hand))
        np.testing.assert_array_equal(model.decision_function(raw, name),
                                      head.decision_function(by_hand))
        assert model.score(raw, y, name) == head.score(by_hand, y)
    scores = model.evaluate(raw, y)
    assert {n: s.accuracy for n, s in scores.items()} == {
        n: h.score(by_hand, y) for n, h in heads.items()}
    # embeddings already transformed take transform "none"
    np.testing.assert_array_equal(model.features(by_hand, "none"), by_hand)


def test_the_model_names_raw_embeddings_of_the_wrong_shape(tmp_path: Path) -> None:
    model, raw = _model_with_transform(tmp_path, "x+sqrt")
    wrong = apply_feature_transform(raw, "x+sqrt")
    with pytest.raises(InputError, match=r"x has shape \(100, 12\), but the model takes raw "
                       r"embeddings of shape \(n, 6\): it applies the feature transform "
                       r"'x\+sqrt' itself, which maps them to its d=12"):
        model.predict(wrong)
    with pytest.raises(ConfigError, match=r"the model holds no head 'svm'; it holds nb, lda, "
                       r"qda"):
        model.head("svm")
