"""``ghofl fit`` on a DP release records its privacy report in the model and its card.

The report beside the release (or given by ``--privacy-report``) must record the release's
SHA-256; its spent budget goes into the manifest's ``privacy`` entry and the card. Without a
report the card says the budget is not recorded (with the header's noise levels) and fit
warns; a report of another release, and a report for exact statistics, are refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ghofl.cli.io import privacy_report_path
from ghofl.cli.main import main
from ghofl.errors import ConfigError, InputError
from ghofl.model.card import CARD_FILE
from ghofl.stats import load_stats
from ghofl.stats.release import NoisyStats
from tests.helpers_cli import run_cli
from tests.integration.test_aggregate_dp_cli import FILES, ws

pytest.importorskip("dp_accounting")

__all__ = ["ws"]  # the payloads of the aggregate tests (a module fixture)

BUDGET_LINE = ("- Differential privacy: (epsilon, delta) = (4, 1e-05), central mode, "
               "neighbouring: add/remove one sample")
K_LINE = ("- Classes whose noised total count was below 5 were dropped by the server "
          "(post-processing of the release)")


@pytest.fixture(scope="module")
def releases(ws: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two DP releases of the payloads (seeds 7 and 8), their reports beside them, and the
    exact total."""
    w = tmp_path_factory.mktemp("releases")
    payloads = [str(ws / f) for f in FILES]
    for name, seed in (("a", "7"), ("b", "8")):
        assert main(["aggregate", *payloads, "--out", str(w / f"{name}.ghs"), "--dp-epsilon",
                     "4", "--dp-delta", "1e-5", "--seed", seed]) == 0
    assert main(["aggregate", *payloads, "--out", str(w / "exact.ghs")]) == 0
    return w


def _fit(total: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]
         ) -> tuple[dict[str, object], str, str]:
    """(manifest, card, stderr) of ``ghofl fit TOTAL --heads lda --out OUT EXTRA``."""
    rc = main(["fit", str(total), "--heads", "lda", "--out", str(out), *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, (out / CARD_FILE).read_text(), captured.err


def test_the_card_shows_the_budget_of_the_report_beside_the_release(
        releases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    total = releases / "a.ghs"
    report = json.loads(privacy_report_path(total).read_text())
    assert report["out_sha256"] == hashlib.sha256(total.read_bytes()).hexdigest()
    manifest, card, err = _fit(total, tmp_path / "m", capsys=capsys)
    assert manifest["privacy"] == report["privacy"]
    assert BUDGET_LINE in card and K_LINE in card
    assert "Differential privacy: none recorded" not in card
    assert "not recorded (its privacy report" not in card
    assert "warning" not in err


def test_a_report_kept_elsewhere_is_given_by_privacy_report(
        releases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    total = tmp_path / "a.ghs"
    shutil.copy(releases / "a.ghs", total)  # no report beside this copy
    kept = tmp_path / "kept" / "report.json"
    kept.parent.mkdir()
    shutil.copy(privacy_report_path(releases / "a.ghs"), kept)
    manifest, card, err = _fit(total, tmp_path / "m", "--privacy-report", str(kept),
                               capsys=capsys)
    assert manifest["privacy"] == json.loads(kept.read_text())["privacy"]
    assert BUDGET_LINE in card and "warning" not in err
    assert f"--privacy-report {kept}" in card  # the command that reproduces the model


def test_without_its_report_the_card_says_the_budget_is_not_recorded_and_fit_warns(
        releases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    total = tmp_path / "a.ghs"
    shutil.copy(releases / "a.ghs", total)
    released = load_stats(total)
    assert isinstance(released, NoisyStats)
    manifest, card, err = _fit(total, tmp_path / "m", capsys=capsys)
    sigma = dict(released.noise_sigma)
    assert manifest["privacy"] == {"budget_recorded": False, "sigma": sigma}
    levels = ", ".join(f"{b}={v:.4g}" for b, v in sigma.items())
    assert ("- Differential privacy: the statistics are a differentially private release "
            "whose budget (epsilon, delta) is not recorded (its privacy report was not "
            f"given); noise sigma per block from their header: {levels}") in card
    assert "Differential privacy: none recorded" not in card
    assert "(epsilon, delta) = (" not in card
    assert "noised and post-processed counts" in card  # the training data's note too
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == [
        f"ghofl: warning: '{total}' is a differentially private release but its privacy "
        f"report '{tmp_path / 'a.privacy.json'}' was not found: the model records the noise "
        "levels, not the budget; give the report with --privacy-report PATH"]


def test_an_exact_total_fits_as_before(releases: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    manifest, card, err = _fit(releases / "exact.ghs", tmp_path / "m", capsys=capsys)
    assert "privacy" not in manifest and "- Differential privacy: none recorded" in card
    assert "warning" not in err


def test_a_report_of_another_release_is_refused(
        releases: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHOFL_DEBUG", "1")
    a, b = releases / "a.ghs", releases / "b.ghs"
    match = (r"^the privacy report '.*b\.privacy\.json' belongs to another release than "
             r"'.*a\.ghs' \(it records SHA-256 [0-9a-f]{12}…, the file has [0-9a-f]{12}…\); "
             r"give the report written with '.*a\.ghs' \(--privacy-report PATH\), or fit the "
             r"release it records$")
    with pytest.raises(InputError, match=match):
        main(["fit", str(a), "--heads", "lda", "--out", str(tmp_path / "m"),
              "--privacy-report", str(privacy_report_path(b))])
    beside = tmp_path / "a.ghs"  # b's report beside a copy of a, under a's report name
    shutil.copy(a, beside)
    shutil.copy(privacy_report_path(b), privacy_report_path(beside))
    with pytest.raises(InputError, match=r"^the privacy report '.*a\.privacy\.json' belongs "
                                         r"to another release than '.*a\.ghs'"):
        main(["fit", str(beside), "--heads", "lda", "--out", str(tmp_path / "m")])
    assert not (tmp_path / "m").exists()


def test_a_refusal_is_one_line_and_exit_status_2(releases: Path, tmp_path: Path) -> None:
    r = run_cli("fit", releases / "a.ghs", "--heads", "lda", "--out", "m",
                "--privacy-report", privacy_report_path(releases / "b.ghs"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "belongs to another release than" in r.stderr
    assert not (tmp_path / "m").exists()


BAD_REPORTS = [
    ("exact-total", "exact.ghs", "a.privacy.json", ConfigError,
     r"^--privacy-report '.*a\.privacy\.json' is given for '.*exact\.ghs', which holds exact "
     r"statistics \(its header records no noise\): a report cannot make exact statistics "
     r"private; drop --privacy-report, or fit the noised release that ghofl aggregate "
     r"--dp-epsilon wrote$"),
    ("no-such-file", "a.ghs", "nowhere.json", InputError,
     r"^--privacy-report '.*nowhere\.json' is not a file; give the privacy report that ghofl "
     r"aggregate --dp-epsilon wrote with '.*a\.ghs'$"),
    ("not-a-report", "a.ghs", "plain.json", InputError,
     r"^'.*plain\.json' is not a privacy report of ghofl aggregate --dp-epsilon \(a JSON "
     r"object with 'privacy' and 'out_sha256'\); give the report written with the release$"),
]


@pytest.mark.parametrize(("total", "report", "error", "match"), [r[1:] for r in BAD_REPORTS],
                         ids=[r[0] for r in BAD_REPORTS])
def test_a_report_fit_cannot_use_is_refused(
        releases: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: str,
        report: str, error: type[Exception], match: str) -> None:
    monkeypatch.setenv("GHOFL_DEBUG", "1")
    plain = tmp_path / "plain.json"  # a report without out_sha256 (not written by aggregate)
    kept = json.loads(privacy_report_path(releases / "a.ghs").read_text())
    plain.write_text(json.dumps({k: v for k, v in kept.items() if k != "out_sha256"}))
    given = plain if report == "plain.json" else releases / report
    with pytest.raises(error, match=match):
        main(["fit", str(releases / total), "--heads", "lda", "--out", str(tmp_path / "m"),
              "--privacy-report", str(given)])
    assert not (tmp_path / "m").exists()
