"""The examples the documentation points to run as they are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_secure_aggregation_example_runs(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples/secure_aggregation.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "survivors: 8, dropped: {" in r.stdout
    error = float(re.search(r"relative error of the secure sum: (\S+)", r.stdout)[1])  # type: ignore[index]
    assert error < 1e-12
    accuracy = float(re.search(r"LDA accuracy from the secure total: (\S+)", r.stdout)[1])  # type: ignore[index]
    assert accuracy > 0.9
    for stage in ("advertise", "reveal", "share", "mask", "unmask"):
        assert stage in r.stdout
