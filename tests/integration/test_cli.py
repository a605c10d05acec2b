"""The ``ghofl`` command run for real, as subprocesses, on tiny archives.

The file flow client-stats → aggregate → fit → evaluate must give the accuracies of heads
fitted centrally; every bad input must exit non-zero with one line on stderr, no traceback,
and no output file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ghofl.cli.main import build_command, main
from ghofl.client.transforms import apply_feature_transform
from ghofl.data.partition import dirichlet_partition
from ghofl.heads.registry import make_head
from ghofl.stats import EncoderInfo, compute_stats, load_stats, save_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli, tree, write_npz

C, D = 3, 5


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace of inputs: train/test/client archives, statistics files, a model dir."""
    w = tmp_path_factory.mktemp("ws")
    x, y = gaussian_mixture(5, num_classes=C, dim=D, n=360, sep=1.5)
    xtr, ytr, xte, yte = x[:300], y[:300], x[300:], y[300:]
    np.save(w / "arrays.npy", np.arange(3))
    write_npz(w / "train.npz", xtr, ytr)
    write_npz(w / "test.npz", xte, yte)
    write_npz(w / "test_d4.npz", xte[:, :4], yte)
    parts = dirichlet_partition(ytr, 3, 0.5, seed=1, min_per_client=5)
    no_top = np.flatnonzero(ytr != C - 1)  # a client that lacks the highest class
    parts[0] = np.setdiff1d(parts[0], np.setdiff1d(parts[0], no_top))
    parts[1] = np.union1d(parts[1], np.setdiff1d(np.arange(300), np.concatenate(parts)))
    for i, idx in enumerate(parts):
        write_npz(w / f"client{i}.npz", xtr[idx], ytr[idx])
    write_npz(w / "named.npz", xtr[:30], ytr[:30], classes=["cat", "dog", "emu"])
    write_npz(w / "named2.npz", xtr[:30], ytr[:30], classes=["cat", "dog", "gnu"])
    np.savez(w / "nox.npz", y=ytr[:30])
    write_npz(w / "flat.npz", xtr[:30, 0], ytr[:30])
    bad = xtr[:30].copy()
    bad[4, 1] = np.nan
    write_npz(w / "nan.npz", bad, ytr[:30])
    neg = ytr[:30].copy()
    neg[3] = -1
    write_npz(w / "neg.npz", xtr[:30], neg)
    (w / "corrupt.npz").write_bytes(b"PK\x03\x04 this is not really a zip archive")
    (w / "garbage.ghs").write_bytes(b"\x00" * 64)
    save_stats(compute_stats(xtr[:40], ytr[:40], C, "full"), w / "good.ghs")
    save_stats(compute_stats(xtr[:40, :4], ytr[:40], C, "full"), w / "d4.ghs")
    save_stats(compute_stats(xtr[:40], ytr[:40], C, "pooled"), w / "pooled.ghs")
    save_stats(compute_stats(xtr[:40], ytr[:40], C, "full", EncoderInfo("lite0", D)),
               w / "enc.ghs")
    assert main(["fit", str(w / "good.ghs"), "--heads", "nb,lda", "--out", str(w / "model")]) == 0
    return w


def _ok(result: object) -> None:
    rc = getattr(result, "returncode", None)
    assert rc == 0, f"exit {rc}\nstdout: {getattr(result, 'stdout', '')}\n" \
        f"stderr: {getattr(result, 'stderr', '')}"


# ---------------------------------------------------------------------- the happy paths
@pytest.mark.slow
def test_file_flow_matches_centralised_heads(ws: Path, tmp_path: Path) -> None:
    for i in range(3):
        r = run_cli("client-stats", "--embeddings", ws / f"client{i}.npz", "--out",
                    f"c{i}.ghs", "--num-classes", str(C), cwd=tmp_path)
        _ok(r)
        assert re.fullmatch(rf"wrote c{i}\.ghs: n=\d+ samples, 3 classes, mode full, dim 5, "
                            r"\d+ bytes of statistics \(\d+ on disk\)\n", r.stdout)
    r = run_cli("aggregate", "c0.ghs", "c1.ghs", "c2.ghs", "--out", "total.ghs", cwd=tmp_path)
    _ok(r)
    assert "aggregated 3 files into total.ghs: n=300 samples" in r.stdout
    heads = ["nb", "lda", "qda", "fedcgs"]
    r = run_cli("fit", "total.ghs", "--heads", ",".join(heads), "--param", "lda.shrinkage=auto",
                "--param", "qda.shrinkage=0.2", "--out", "model", cwd=tmp_path)
    _ok(r)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == \
        sorted([f"{h}.ghh" for h in heads] + ["MODEL_CARD.md", "manifest.json", "ood.npz"])
    card = (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert all(f"| {h} | {h} |" in card for h in heads)
    assert "ghofl fit total.ghs --heads nb,lda,qda,fedcgs --param lda.shrinkage=auto" in card
    assert "No test data was given" in card
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["format"] == "ghofl.model" and list(manifest["heads"]) == heads
    assert manifest["heads"]["lda"]["params"]["shrinkage"] == "auto"
    assert manifest["stats"]["n_samples"] == 300 and manifest["stats"]["mode"] == "full"
    assert "ghofl_version" in manifest
    r = run_cli("evaluate", "model", "--embeddings", ws / "test.npz", "--json", "eval.json",
                cwd=tmp_path)
    _ok(r)
    report = json.loads((tmp_path / "eval.json").read_text())

    train = np.load(ws / "train.npz")
    test = np.load(ws / "test.npz")
    central = compute_stats(train["x"], train["y"], C, "full")
    params: dict[str, dict[str, object]] = {"lda": {"shrinkage": "auto"},
                                            "qda": {"shrinkage": 0.2}}
    for h in heads:
        expected = make_head(h, **params.get(h, {})).fit_from_stats(central)
        assert report["heads"][h]["accuracy"] == expected.score(test["x"], test["y"])
        assert report["heads"][h]["n"] == 60
        assert h in r.stdout

    # refitting replaces the model directory as a whole; a failed fit leaves it intact
    _ok(run_cli("fit", "total.ghs", "--heads", "nb", "--out", "model", cwd=tmp_path))
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "MODEL_CARD.md", "manifest.json", "nb.ghh", "ood.npz"]
    r = run_cli("fit", "total.ghs", "--heads", "lda", "--param", "lda.shrinkage=7",
                "--out", "model", cwd=tmp_path)
    assert r.returncode == 2 and "shrinkage must be a number in [0, 1]" in r.stderr
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "MODEL_CARD.md", "manifest.json", "nb.ghh", "ood.npz"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_simulate_writes_the_json_contract(ws: Path, tmp_path: Path) -> None:
    r = run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "7", "--alpha", "0.1", "--seed", "3", "--heads", "nb,lda",
                "--param", "lda.shrinkage=0.1", "--json", "sim.json", cwd=tmp_path)
    _ok(r)
    out = json.loads((tmp_path / "sim.json").read_text())
    assert (out["clients"], out["alpha"], out["seed"], out["mode"]) == (7, 0.1, 3, "full")
    assert (out["n_train"], out["n_test"], out["num_classes"]) == (300, 60, 3)
    assert out["projection_dim"] is None and len(out["client_sizes"]) == 7
    assert out["upload_bytes_per_client"] == 8 * (3 + 3 * 5 + 3 * 15)
    assert out["heads"]["lda"]["params"]["shrinkage"] == 0.1
    assert set(out["heads"]["nb"]) == {"accuracy", "fit_seconds", "predict_seconds", "params"}
    assert {"partition", "client_stats", "aggregate", "fit/nb", "evaluate/lda"} <= \
        set(out["stage_seconds"])
    assert "7 clients, alpha=0.1" in r.stdout and "lda" in r.stdout


def test_heads_lists_modes_and_defaults(tmp_path: Path) -> None:
    r = run_cli("heads", "--json", cwd=tmp_path)
    _ok(r)
    info = json.loads(r.stdout)
    assert info["nb"]["min_mode"] == "diag" and info["qda"]["min_mode"] == "full"
    assert info["lda"]["min_mode"] == info["ridge"]["min_mode"] == "gram"
    assert info["lda"]["params"]["shrinkage"] == "auto"
    _ok(plain := run_cli("heads", cwd=tmp_path))
    assert re.search(r"^lda\s+gram\s+shrinkage='auto'", plain.stdout, re.M)


def test_version_and_help(tmp_path: Path) -> None:
    r = run_cli("--version", cwd=tmp_path)
    _ok(r)
    assert r.stdout.startswith("ghofl ")
    r = run_cli(cwd=tmp_path)
    _ok(r)
    assert "client-stats" in r.stdout and "simulate" in r.stdout


def test_debug_shows_the_traceback(ws: Path, tmp_path: Path) -> None:
    r = run_cli("aggregate", ws / "nope.ghs", "--out", "t.ghs", cwd=tmp_path,
                env={"GHOFL_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr and "StatsFormatError" in r.stderr


# ---------------------------------------------------------------------- bad inputs
W = "{w}"
# Run as subprocesses: the bad inputs the CLI contract lists.
BAD_CASES = [
    ("missing-file", ["client-stats", "--embeddings", f"{W}/nope.npz", "--out", "o.ghs"],
     r"--embeddings file '.*nope\.npz' does not exist; check the path"),
    ("npz-without-x", ["client-stats", "--embeddings", f"{W}/nox.npz", "--out", "o.ghs"],
     r"'.*nox\.npz' has no array 'x' \(it holds: y\); write it with numpy\.savez"),
    ("x-not-2d", ["client-stats", "--embeddings", f"{W}/flat.npz", "--out", "o.ghs"],
     r"x must be a 2-D array \(n, d\); got shape \(30,\)"),
    ("nan-in-x", ["client-stats", "--embeddings", f"{W}/nan.npz", "--out", "o.ghs"],
     r"embeddings contain NaN or infinite values \(first bad row 4\)"),
    ("label-too-large", ["client-stats", "--embeddings", f"{W}/client1.npz", "--num-classes",
                         "2", "--out", "o.ghs"],
     r"label 2 is out of range for 2 classes \(0\.\.1\); pass --num-classes or --classes"),
    ("negative-label", ["client-stats", "--embeddings", f"{W}/neg.npz", "--out", "o.ghs"],
     r"labels must be class indices 0\.\.2; got the negative label -1"),
    ("corrupt-npz", ["client-stats", "--embeddings", f"{W}/corrupt.npz", "--out", "o.ghs"],
     r"'.*corrupt\.npz' is not a readable \.npz archive \(.*\); write it with numpy\.savez"),
    ("aggregate-dim", ["aggregate", f"{W}/good.ghs", f"{W}/d4.ghs", "--out", "t.ghs"],
     r"cannot add '.*d4\.ghs' to the total of the files before it: .*differ in dim \(5 vs 4\)"),
    ("aggregate-mode", ["aggregate", f"{W}/good.ghs", f"{W}/pooled.ghs", "--out", "t.ghs"],
     r"cannot add '.*pooled\.ghs' .*differ in mode \('full' vs 'pooled'\)"),
    ("aggregate-encoder", ["aggregate", f"{W}/good.ghs", f"{W}/enc.ghs", "--out", "t.ghs"],
     r"cannot add '.*enc\.ghs' .*differ in encoder \(none vs lite0"),
    ("fit-unknown-head", ["fit", f"{W}/good.ghs", "--heads", "nb,svm", "--out", "m"],
     r"unknown head 'svm'; available heads: nb, lda, qda, fedcgs"),
    ("fit-unknown-param", ["fit", f"{W}/good.ghs", "--heads", "lda", "--param", "lda.foo=1",
                           "--out", "m"],
     r"--param 'lda\.foo=1': head 'lda' has no parameter 'foo'; valid keys: "
     r"covariance_divisor, shrinkage"),
    ("fit-richer-mode", ["fit", f"{W}/pooled.ghs", "--heads", "nb,qda", "--out", "m"],
     r"head 'qda' needs upload mode 'full' or richer \(full\), but the statistics are mode "
     r"'pooled'; "
     r"compute the client statistics with mode 'full' \(--mode full\)"),
    ("evaluate-dims", ["evaluate", f"{W}/model", "--embeddings", f"{W}/test_d4.npz",
                       "--json", "e.json"],
     r"'.*test_d4\.npz' has 4-dimensional embeddings but the model in '.*model' expects d=5"),
    ("simulate-richer-mode", ["simulate", "--train", f"{W}/train.npz", "--test",
                              f"{W}/test.npz", "--clients", "3", "--alpha", "0.1", "--mode",
                              "diag", "--heads", "nb,lda", "--json", "s.json"],
     r"head 'lda' needs upload mode 'gram' or richer \(full, pooled or gram\), but the "
     r"statistics are mode 'diag'"),
]
# Run in-process through main() (same code path, without the interpreter start-up).
MORE_BAD_CASES = [
    ("not-an-npz", ["client-stats", "--embeddings", f"{W}/arrays.npy", "--out", "o.ghs"],
     r"'.*arrays\.npy' (holds a single array|is not a readable \.npz archive)"),
    ("bad-mode", ["client-stats", "--embeddings", f"{W}/train.npz", "--mode", "huge",
                  "--out", "o.ghs"], r"--mode must be one of full, pooled, gram, diag, means; got 'huge'"),
    ("classes-disagree", ["client-stats", "--embeddings", f"{W}/train.npz", "--classes", "a,b",
                          "--num-classes", "3", "--out", "o.ghs"],
     r"--num-classes 3 disagrees with --classes, which names 2 classes"),
    ("archive-classes-disagree", ["client-stats", "--embeddings", f"{W}/named.npz",
                                  "--num-classes", "4", "--out", "o.ghs"],
     r"--num-classes 4 disagrees with '.*named\.npz', which stores 3 class names"),
    ("seed-without-dim", ["client-stats", "--embeddings", f"{W}/train.npz",
                          "--projection-seed", "3", "--out", "o.ghs"],
     r"--projection-seed needs --projection-dim"),
    ("missing-option", ["client-stats", "--embeddings", f"{W}/train.npz"],
     r"Missing option '--out'.*see 'ghofl client-stats --help'"),
    ("aggregate-missing", ["aggregate", f"{W}/good.ghs", f"{W}/nope.ghs", "--out", "t.ghs"],
     r"statistics file '.*nope\.ghs' does not exist"),
    ("aggregate-corrupt", ["aggregate", f"{W}/good.ghs", f"{W}/garbage.ghs", "--out", "t.ghs"],
     r"'.*garbage\.ghs' is not a readable ghofl statistics file"),
    ("fit-param-value", ["fit", f"{W}/good.ghs", "--heads", "nb", "--param",
                         "nb.var_smoothing=abc", "--out", "m"],
     r"--param 'nb\.var_smoothing=abc': expected a number \(or auto\); got 'abc'"),
    ("fit-param-format", ["fit", f"{W}/good.ghs", "--heads", "lda", "--param", "lda",
                          "--out", "m"], r"--param 'lda' must look like HEAD\.KEY=VALUE"),
    ("fit-param-other-head", ["fit", f"{W}/good.ghs", "--heads", "nb", "--param",
                              "lda.shrinkage=0.1", "--out", "m"],
     r"names head 'lda', which is not among the heads to fit \(nb\)"),
    ("fit-out-not-model", ["fit", f"{W}/good.ghs", "--heads", "nb", "--out", f"{W}"],
     r"refusing to replace --out '.*': it is a non-empty directory that is not a ghofl model"),
    ("evaluate-not-model", ["evaluate", f"{W}", "--embeddings", f"{W}/test.npz",
                            "--json", "e.json"], r"has no manifest\.json, so it is not a ghofl "
     r"model directory"),
    ("simulate-alpha", ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz",
                        "--clients", "3", "--alpha", "0", "--json", "s.json"],
     r"alpha \(the Dirichlet concentration\) must be a finite number > 0; got 0\.0"),
    ("simulate-clients", ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz",
                          "--clients", "0", "--alpha", "0.1", "--json", "s.json"],
     r"num_clients must be an integer >= 1; got 0"),
    ("simulate-test-dims", ["simulate", "--train", f"{W}/train.npz", "--test",
                            f"{W}/test_d4.npz", "--clients", "3", "--alpha", "0.1",
                            "--json", "s.json"],
     r"test embeddings have d=4 but training embeddings have d=5"),
    ("simulate-bad-number", ["simulate", "--train", f"{W}/train.npz", "--test",
                             f"{W}/test.npz", "--clients", "many", "--alpha", "0.1"],
     r"Invalid value for '--clients': 'many' is not a valid integer"),
    ("secure-without-clip", ["simulate", "--train", f"{W}/train.npz", "--test",
                             f"{W}/test.npz", "--clients", "5", "--alpha", "0.1", "--secure",
                             "--json", "s.json"],
     r"--secure needs --clip R: the fixed-point encoding of the secure sum needs a per-sample "
     r"clipping bound\. --train records no shipped encoder \(at a measured resolution and "
     r"weights\), so it has no default clipping bound: "
     r".*\(the largest in --train is 7\.948\), e\.g\. --clip 8\.4$"),
    ("threshold-without-secure", ["simulate", "--train", f"{W}/train.npz", "--test",
                                  f"{W}/test.npz", "--clients", "5", "--alpha", "0.1",
                                  "--threshold", "3"],
     r"--threshold only applies to the secure protocol; add --secure"),
    ("secure-bad-drop", ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz",
                         "--clients", "5", "--alpha", "0.1", "--secure", "--clip", "50",
                         "--drop", "input=1"],
     r"--drop must look like STAGE=COUNT with STAGE one of advertise, reveal, share, mask, "
     r"consistency, unmask; got 'input=1'"),
    ("secure-below-threshold", ["simulate", "--train", f"{W}/train.npz", "--test",
                                f"{W}/test.npz", "--clients", "6", "--alpha", "0.5",
                                "--secure", "--clip", "50", "--threshold", "4", "--drop",
                                "share=3", "--json", "s.json"],
     r"secure aggregation aborted: only 3 of 6 clients sent their secret shares, below the "
     r"threshold t=4; no result was produced"),
    ("secure-threshold-too-high", ["simulate", "--train", f"{W}/train.npz", "--test",
                                   f"{W}/test.npz", "--clients", "3", "--alpha", "0.5",
                                   "--secure", "--clip", "50", "--threshold", "4"],
     r"threshold t=4 is larger than the number of clients \(3\); give --threshold between 2 "
     r"and 3"),
    ("flower-secure-no-clip", ["flower-run", "--engine", "simulation", "--nodes", "2",
                               "--data-template", "p-{partition_id}.npz", "--out", "o",
                               "--secure"],
     r"--secure needs --clip R: the fixed-point encoding of the secure sum needs a per-sample "
     r"clipping bound$"),
    ("flower-engine", ["flower-run", "--engine", "cloud", "--nodes", "2", "--data-template",
                       "p-{partition_id}.npz", "--out", "o"],
     r"--engine must be 'simulation' or 'deployment'; got 'cloud'"),
    ("secure-bad-clip", ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz",
                         "--clients", "3", "--alpha", "0.5", "--secure", "--clip", "-1"],
     r"--clip \(the per-sample L2 clipping bound R\) must be a finite number > 0; got -1\.0"),
]

# The client-side upload options and --preset fail alike on every command that takes them,
# before any work (flower-run starts no process).
_OPTION_COMMANDS = {
    "flower-run": ["flower-run", "--data-template", "p-{partition_id}.npz", "--out", "o",
                   "--classes", "3"],
    "simulate": ["simulate", "--train", f"{W}/train.npz", "--test", f"{W}/test.npz",
                 "--clients", "2", "--alpha", "1.0"],
    "client-stats": ["client-stats", "--embeddings", f"{W}/train.npz", "--out", "o.ghs",
                     "--num-classes", "3"],
    "fit": ["fit", f"{W}/good.ghs", "--out", "model"],
}
_CLIENT_SIDE = ("flower-run", "simulate", "client-stats")
MORE_BAD_CASES += [
    (f"{case}-{command}", [*_OPTION_COMMANDS[command], *options], pattern)
    for case, options, commands, pattern in [
        ("holdout-too-large", ["--holdout", "0.7"], _CLIENT_SIDE,
         r"--holdout: the held-out fraction must be 0 \(no held-out section\) or a number in "
         r"\(0, 0\.5\]; got 0\.7"),
        ("holdout-negative", ["--holdout", "-0.1"], _CLIENT_SIDE,
         r"--holdout: the held-out fraction must be 0 .*got -0\.1"),
        ("holdout-seed", ["--holdout-seed", "-1"], _CLIENT_SIDE,
         r"--holdout-seed must be an integer >= 0; got -1"),
        ("transport-dtype", ["--transport-dtype", "float16"], _CLIENT_SIDE,
         r"--transport-dtype must be one of float64, float32; got 'float16'"),
        ("float32-secure", ["--secure", "--clip", "30", "--transport-dtype", "float32"],
         ("flower-run", "simulate"),
         r"--transport-dtype 'float32' applies to plain uploads; secure aggregation sends its "
         r"own fixed-point encoding of the float64 sums, so drop --transport-dtype or --secure$"),
        ("feature-transform", ["--feature-transform", "cube"], _CLIENT_SIDE,
         r"--feature-transform must be one of none, sqrt, x\+sqrt or "
         r"x\+sqrt\+rbf:<kernel-map fingerprint>; got 'cube'"),
        ("preset", ["--preset", "fast"], ("flower-run", "simulate", "fit"),
         r"unknown preset 'fast'; available presets: default, paper"),
        ("param", ["--heads", "lda", "--param", "lda.foo=1"], ("flower-run", "simulate", "fit"),
         r"--param 'lda\.foo=1': head 'lda' has no parameter 'foo'; valid keys: "),
    ]
    for command in commands
]


def test_shared_options_have_one_declaration() -> None:
    """Every command that takes an option shows the same help for it."""
    cli = build_command()
    commands = cli.commands  # type: ignore[attr-defined]
    for flag, names in (("--holdout", ("flower-run", "simulate", "client-stats")),
                        ("--holdout-seed", ("flower-run", "simulate", "client-stats")),
                        ("--transport-dtype", ("flower-run", "simulate", "client-stats")),
                        ("--preset", ("flower-run", "simulate", "fit")),
                        ("--feature-transform", ("flower-run", "simulate", "client-stats",
                                                 "evaluate", "projection-basis")),
                        ("--param", ("flower-run", "simulate", "fit", "demo"))):
        helps = {next(p.help for p in commands[n].params if flag in p.opts) for n in names}
        assert len(helps) == 1, (flag, helps)


@pytest.mark.parametrize(("args", "pattern"), [c[1:] for c in BAD_CASES],
                         ids=[c[0] for c in BAD_CASES])
def test_bad_input_fails_with_one_clear_line(
    ws: Path, tmp_path: Path, args: list[str], pattern: str
) -> None:
    before = tree(ws)
    r = run_cli(*[a.replace(W, str(ws)) for a in args], cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert re.fullmatch(r"ghofl: error: .+", lines[0])
    assert re.search(pattern, lines[0]), lines[0]
    assert tree(tmp_path) == [], "a failed command left output behind"
    assert tree(ws) == before


@pytest.mark.parametrize(("args", "pattern"), [c[1:] for c in MORE_BAD_CASES],
                         ids=[c[0] for c in MORE_BAD_CASES])
def test_more_bad_input_in_process(
    ws: Path, tmp_path: Path, args: list[str], pattern: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    before = tree(ws)
    monkeypatch.chdir(tmp_path)
    rc = main([a.replace(W, str(ws)) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(r"ghofl: error: .+", lines[0])
    assert re.search(pattern, lines[0]), lines[0]
    assert tree(tmp_path) == [], "a failed command left output behind"
    assert tree(ws) == before


def test_named_classes_projection_and_encoder_in_process(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["client-stats", "--embeddings", str(ws / "named.npz"), "--out", "n.ghs",
                 "--projection-dim", "3", "--projection-seed", "7",
                 "--encoder-name", "lite0"]) == 0
    stats = load_stats(tmp_path / "n.ghs")
    assert stats.meta.classes == ("cat", "dog", "emu") and stats.dim == 3
    assert stats.meta.projection is not None and stats.meta.projection.seed == 7
    assert stats.meta.encoder is not None and stats.meta.encoder.name == "lite0"
    assert main(["client-stats", "--embeddings", str(ws / "train.npz"), "--out", "c.ghs",
                 "--clip", "1.0"]) == 0
    clipped = load_stats(tmp_path / "c.ghs")
    assert clipped.meta.clip_norm == 1.0 and 0 < clipped.n_clipped <= 300
    assert f"{clipped.n_clipped} samples clipped to norm 1" in capsys.readouterr().out
    assert main(["fit", "n.ghs", "--heads", "nb,qda", "--out", "m"]) == 0
    assert main(["evaluate", "m", "--embeddings", str(ws / "named.npz"), "--json", "e.json"]) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    assert set(report["heads"]) == {"nb", "qda"} and report["heads"]["qda"]["n"] == 30
    capsys.readouterr()
    assert main(["evaluate", "m", "--embeddings", str(ws / "test.npz")]) == 0  # unnamed: fine
    assert main(["evaluate", "m", "--embeddings", str(ws / "named2.npz")]) == 2
    assert re.search(r"'.*named2\.npz' stores the class names \[cat, dog, gnu\], which differ "
                     r"from the model's \[cat, dog, emu\]", capsys.readouterr().err)


def test_gram_mode_from_client_stats_to_evaluate(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """client-stats --mode gram → aggregate → fit lda,ridge → evaluate gives the accuracies of
    the same heads fitted centrally from pooled statistics; nb refuses the gram total."""
    monkeypatch.chdir(tmp_path)
    for i in range(3):
        assert main(["client-stats", "--embeddings", str(ws / f"client{i}.npz"), "--out",
                     f"g{i}.ghs", "--num-classes", str(C), "--mode", "gram"]) == 0
    assert "mode gram" in capsys.readouterr().out
    assert main(["aggregate", "g0.ghs", "g1.ghs", "g2.ghs", "--out", "g.ghs"]) == 0
    total = load_stats(tmp_path / "g.ghs")
    assert total.mode == "gram" and total.sq_sums is None and total.n_samples == 300
    assert main(["fit", "g.ghs", "--heads", "lda,ridge", "--out", "m"]) == 0
    assert main(["evaluate", "m", "--embeddings", str(ws / "test.npz"), "--json", "e.json"]) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    train, test = np.load(ws / "train.npz"), np.load(ws / "test.npz")
    pooled = compute_stats(train["x"], train["y"], C, "pooled")
    for h in ("lda", "ridge"):
        expected = make_head(h).fit_from_stats(pooled).score(test["x"], test["y"])
        assert report["heads"][h]["accuracy"] == expected
    capsys.readouterr()
    assert main(["fit", "g.ghs", "--heads", "nb", "--out", "m2"]) == 2
    assert re.search(r"head 'nb' needs upload mode 'diag' or richer \(full, pooled or diag\), "
                     r"but the statistics are mode 'gram'.*--mode diag", capsys.readouterr().err)


ALL_HEADS = "nb,lda,qda,fedcgs,fishermix,protohyper"
FAST_TRAINING = ("--param", "fishermix.epochs=3", "--param", "protohyper.epochs=3",
                 "--param", "fishermix.n_per_class=300", "--param", "protohyper.n_per_class=300")


def test_simulate_with_every_head_is_partition_invariant(ws: Path, tmp_path: Path) -> None:
    accs = []
    for clients, alpha in ((3, 0.05), (20, 0.5)):
        out = f"sim-{clients}.json"
        r = run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                    "--clients", str(clients), "--alpha", str(alpha), "--seed", "1",
                    "--heads", ALL_HEADS, *FAST_TRAINING, "--json", out, cwd=tmp_path)
        _ok(r)
        res = json.loads((tmp_path / out).read_text())
        assert list(res["heads"]) == ALL_HEADS.split(",")
        assert res["heads"]["fishermix"]["params"]["epochs"] == 3
        assert res["heads"]["protohyper"]["params"]["seed"] == 1  # the simulation seed
        accs.append({h: v["accuracy"] for h, v in res["heads"].items()})
    assert accs[0] == accs[1]


def _simulate_json(ws: Path, tmp_path: Path, out: str, *extra: str) -> dict[str, object]:
    r = run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "8", "--alpha", "0.5", "--seed", "2", "--heads", ALL_HEADS,
                *FAST_TRAINING, "--json", out, *extra, cwd=tmp_path)
    _ok(r)
    res: dict[str, object] = json.loads((tmp_path / out).read_text())
    res["stdout"] = r.stdout
    return res


@pytest.mark.slow
def test_secure_simulation_gives_the_plain_accuracies(ws: Path, tmp_path: Path) -> None:
    plain = _simulate_json(ws, tmp_path, "plain.json", "--clip", "50")
    secure = _simulate_json(ws, tmp_path, "secure.json", "--secure", "--clip", "50")
    late = _simulate_json(ws, tmp_path, "late.json", "--secure", "--clip", "50",
                          "--drop", "unmask=2")
    acc = {name: {h: v["accuracy"] for h, v in res["heads"].items()}  # type: ignore[attr-defined]
           for name, res in (("plain", plain), ("secure", secure), ("late", late))}
    assert acc["secure"] == acc["plain"] and acc["late"] == acc["plain"]
    agg = secure["aggregation"]
    assert isinstance(agg, dict) and agg["protocol"] == "secure" and agg["survivors"] == 8
    assert list(agg["stages"]) == ["advertise", "reveal", "share", "mask", "consistency", "unmask"]
    for stage in agg["stages"].values():
        assert stage["server_seconds"] >= 0 and stage["client_sent_bytes_mean"] > 0
        assert stage["client_received_bytes_mean"] > 0 and stage["server_received_bytes"] > 0
    assert agg["params"]["threshold"] == 6 and agg["params"]["clip_norm"] == 50.0
    assert secure["clip_norm"] == 50.0 and secure["n_clipped"] == 0
    late_agg = late["aggregation"]
    assert isinstance(late_agg, dict) and late_agg["survivors"] == 8
    assert sorted(late_agg["dropped"].values()) == ["unmask", "unmask"]
    assert "(its input is in the sum)" in str(late["stdout"])
    assert "secure aggregation: 8 of 8 clients in the sum" in str(secure["stdout"])


def test_secure_simulation_with_dropouts_fits_the_survivors(ws: Path, tmp_path: Path) -> None:
    res = _simulate_json(ws, tmp_path, "drop.json", "--secure", "--clip", "1.5",
                         "--drop", "mask=2", "--drop", "advertise=1", "--threshold", "5")
    agg = res["aggregation"]
    assert isinstance(agg, dict) and agg["survivors"] == 5
    assert sorted(agg["dropped"].values()) == ["advertise", "mask", "mask"]
    assert 0 < int(res["n_clipped"]) < 300  # type: ignore[call-overload]
    assert "samples were scaled down" in str(res["stdout"])


def test_fit_and_evaluate_every_head(ws: Path, tmp_path: Path) -> None:
    _ok(run_cli("client-stats", "--embeddings", ws / "train.npz", "--out", "t.ghs", cwd=tmp_path))
    _ok(run_cli("fit", "t.ghs", "--heads", ALL_HEADS, *FAST_TRAINING, "--out", "model",
                cwd=tmp_path))
    assert sorted(p.name for p in (tmp_path / "model").glob("*.ghh")) == sorted(
        f"{h}.ghh" for h in ALL_HEADS.split(","))
    _ok(run_cli("evaluate", "model", "--embeddings", ws / "test.npz", "--json", "e.json",
                cwd=tmp_path))
    scores = json.loads((tmp_path / "e.json").read_text())["heads"]
    assert set(scores) == set(ALL_HEADS.split(",")) and all(
        s["accuracy"] > 0.5 for s in scores.values())


def test_feature_transform_from_client_stats_to_evaluate(ws: Path, tmp_path: Path) -> None:
    """x+sqrt statistics: the model scores raw test embeddings given the same flag, and
    without it the error names the flag."""
    _ok(run_cli("client-stats", "--embeddings", ws / "train.npz", "--out", "t.ghs",
                "--mode", "pooled", "--encoder-name", "toy", "--feature-transform", "x+sqrt",
                cwd=tmp_path))
    assert load_stats(tmp_path / "t.ghs").meta.dim == 2 * D
    _ok(run_cli("fit", "t.ghs", "--heads", "lda,ridge", "--out", "model", cwd=tmp_path))
    r = run_cli("evaluate", "model", "--embeddings", ws / "test.npz", cwd=tmp_path)
    assert r.returncode == 2
    assert re.search(r"has 5-dimensional embeddings but the model in '.*' expects d=10; the "
                     r"clients applied --feature-transform x\+sqrt; pass the same", r.stderr)
    _ok(run_cli("evaluate", "model", "--embeddings", ws / "test.npz", "--feature-transform",
                "x+sqrt", "--json", "e.json", cwd=tmp_path))
    scores = json.loads((tmp_path / "e.json").read_text())["heads"]
    train, test = np.load(ws / "train.npz"), np.load(ws / "test.npz")
    pooled = compute_stats(apply_feature_transform(train["x"], "x+sqrt"), train["y"], C,
                           "pooled")
    for h in ("lda", "ridge"):
        want = make_head(h).fit_from_stats(pooled).score(
            apply_feature_transform(test["x"], "x+sqrt"), test["y"])
        assert scores[h]["accuracy"] == want
    _ok(run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "3", "--alpha", "0.5", "--heads", "lda,ridge", "--mode", "pooled",
                "--feature-transform", "x+sqrt", "--json", "sim.json", cwd=tmp_path))
    sim = json.loads((tmp_path / "sim.json").read_text())
    assert sim["feature_transform"] == "x+sqrt"
    assert {h: v["accuracy"] for h, v in sim["heads"].items()} == {
        h: s["accuracy"] for h, s in scores.items()}  # partition invariance



def test_default_projection_basis_of_transformed_embeddings(ws: Path, tmp_path: Path) -> None:
    """A basis built with --feature-transform is the default of the transformed encoder, and
    client-stats with the same transform finds and applies it."""
    from ghofl.client.local_data import ENCODER_KEY

    train = np.load(ws / "train.npz")
    info = EncoderInfo("toy", D)
    np.savez(tmp_path / "public.npz", x=train["x"][:200], y=train["y"][:200],
             **{ENCODER_KEY: np.asarray(json.dumps(info.to_dict()))})
    np.savez(tmp_path / "client.npz", x=train["x"][200:], y=train["y"][200:],
             **{ENCODER_KEY: np.asarray(json.dumps(info.to_dict()))})
    env = {"GHOFL_PROJECTION_DIR": str(tmp_path / "bases")}
    r = run_cli("projection-basis", "--embeddings", "public.npz", "--k", "6",
                "--feature-transform", "x+sqrt", cwd=tmp_path, env=env)
    _ok(r)
    assert re.search(r": 10 x 6 principal directions, fingerprint [0-9a-f]{16}, default for "
                     r"encoder toy", r.stdout)
    _ok(run_cli("client-stats", "--embeddings", "client.npz", "--out", "c.ghs", "--mode",
                "pooled", "--num-classes", str(C), "--feature-transform", "x+sqrt",
                "--projection-dim", "4", "--projection-basis", "default", cwd=tmp_path, env=env))
    meta = load_stats(tmp_path / "c.ghs").meta
    assert meta.dim == 4 and meta.projection is not None and meta.projection.input_dim == 2 * D
    r = run_cli("client-stats", "--embeddings", "client.npz", "--out", "d.ghs", "--mode",
                "pooled", "--num-classes", str(C), "--projection-dim", "4",
                "--projection-basis", "default", cwd=tmp_path, env=env)
    assert r.returncode == 2  # the plain encoder has no default basis: only x+sqrt has one
    assert "no principal-direction basis is recorded for the encoder with fingerprint" in r.stderr


def test_kernel_feature_map_from_public_data_to_evaluate(ws: Path, tmp_path: Path) -> None:
    """ghofl feature-map builds a public kernel map; client-stats, fit, evaluate and simulate
    all apply x+sqrt+rbf:<fingerprint>; a client without the map file, or a map of too many
    anchors, gets one clear line."""
    train = np.load(ws / "train.npz")
    np.savez(tmp_path / "public.npz", x=train["x"][:200], y=train["y"][:200])
    env = {"GHOFL_PROJECTION_DIR": str(tmp_path / "maps")}
    r = run_cli("feature-map", "--embeddings", "public.npz", "--anchors", "16", cwd=tmp_path,
                env=env)
    _ok(r)
    found = re.search(r": 16 anchors in 5 dimensions, gamma \S+, scale \S+, fingerprint "
                      r"([0-9a-f]{16}); clients use --feature-transform "
                      r"x\+sqrt\+rbf:([0-9a-f]{16})", r.stdout)
    assert found and found.group(1) == found.group(2)
    name = f"x+sqrt+rbf:{found.group(1)}"
    _ok(run_cli("client-stats", "--embeddings", ws / "train.npz", "--out", "t.ghs", "--mode",
                "pooled", "--encoder-name", "toy", "--feature-transform", name, cwd=tmp_path,
                env=env))
    meta = load_stats(tmp_path / "t.ghs").meta
    assert meta.dim == 2 * D + 16 and meta.encoder is not None
    assert meta.encoder.preprocessing.split("; then ")[-1] == name
    _ok(run_cli("fit", "t.ghs", "--heads", "lda,ridge", "--out", "model", cwd=tmp_path,
                env=env))
    r = run_cli("evaluate", "model", "--embeddings", ws / "test.npz", cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert re.search(r"expects d=26; the clients applied --feature-transform "
                     + re.escape(name) + "; pass the same", r.stderr)
    _ok(run_cli("evaluate", "model", "--embeddings", ws / "test.npz", "--feature-transform",
                name, "--json", "e.json", cwd=tmp_path, env=env))
    scores = json.loads((tmp_path / "e.json").read_text())["heads"]
    _ok(run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "3", "--alpha", "0.5", "--heads", "lda,ridge", "--mode", "pooled",
                "--feature-transform", name, "--json", "sim.json", cwd=tmp_path, env=env))
    sim = json.loads((tmp_path / "sim.json").read_text())
    assert sim["feature_transform"] == name
    assert {h: v["accuracy"] for h, v in sim["heads"].items()} == {
        h: s["accuracy"] for h, s in scores.items()}  # partition invariance
    r = run_cli("client-stats", "--embeddings", ws / "train.npz", "--out", "u.ghs",
                "--mode", "pooled", "--feature-transform", name, cwd=tmp_path,
                env={"GHOFL_PROJECTION_DIR": str(tmp_path / "empty"),
                     "HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and not (tmp_path / "u.ghs").exists()
    assert re.search(f"no kernel feature map with fingerprint {found.group(1)} in .*; copy "
                     f"the federation's {found.group(1)}.rbf.npz there", r.stderr)
    r = run_cli("feature-map", "--embeddings", "public.npz", "--anchors", "500", cwd=tmp_path,
                env=env)
    assert r.returncode == 2
    assert "500 anchors need at least as many public samples; got 200" in r.stderr
