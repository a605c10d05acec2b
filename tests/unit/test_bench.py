"""Experiment config, tables and report helpers (no encoders involved)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.bench.config import ExperimentConfig, config_from_dict, load_config
from ghofl.bench.references import logreg_reference, sklearn_lda_reference
from ghofl.bench.report import markdown_table, update_section
from ghofl.bench.runner import heads_for_mode
from ghofl.bench.tables import accuracy_tables, fmt_pct, invariance_summary, mean_std
from ghofl.errors import ConfigError
from tests.helpers import gaussian_mixture


def test_config_defaults_and_grid_size() -> None:
    cfg = config_from_dict(
        {"datasets": ["cifar10"], "alphas": [0.1, 0.5], "clients": [10, 100], "seeds": [0, 1, 2]}
    )
    assert cfg.n_cells() == 12 and cfg.heads[0] == "nb" and cfg.resolution == 224


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"datasets": []}, "experiment key 'datasets' must be a non-empty list"),
        ({"datasets": ["x"], "clients": [0]}, "clients must be integers >= 1; got 0"),
        (
            {"datasets": ["x"], "modes": ["half"]},
            "modes must be among full, pooled, gram, diag, means; got 'half'",
        ),
        (
            {"datasets": ["x"], "projection_dims": [-1]},
            r"projection_dims must be >= 0 \(0 = none\)",
        ),
        ({"datasets": ["x"], "references": ["svm"]}, "unknown reference 'svm'"),
        ({"datasets": ["x"], "backend": "tf"}, "backend must be 'onnx' or 'torch'; got 'tf'"),
        (
            {"datasets": ["x"], "head_params": {"svm": {}}},
            r"\[head_params.svm\] names an unknown head",
        ),
        ({"datasets": ["x"], "alphas": ["a"]}, "alphas must be a list of float"),
        ({"datasets": ["x"], "head_params": {"lda": 3}}, r"head_params must be tables"),
        ({"datasets": ["x"], "secure": "yes"}, r"secure must be true or false; got 'yes'"),
        ({"datasets": ["x"], "clip": -1.0},
         r"clip must be a finite number >= 0 \(0 = no clipping\); got -1\.0"),
        ({"datasets": ["x"], "clip": "auto"}, r"clip must be a finite number >= 0"),
    ],
)
def test_config_errors(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


def test_load_config_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"experiment config '.*nope\.toml' does not exist"):
        load_config(tmp_path / "nope.toml")


def test_repository_configs_are_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"
    configs = sorted(root.glob("*.toml"))
    assert configs
    for p in configs:
        assert load_config(p).n_cells() >= 1


def test_clipping_bound_of_a_run() -> None:
    from ghofl.bench.runner import resolve_clip
    from ghofl.client.encoders import default_clip_norm
    from ghofl.client.encoders.efficientnet_lite import lite_encoder_info
    from ghofl.stats import EncoderInfo

    lite0 = lite_encoder_info("efficientnet-lite0", 224)
    unknown = EncoderInfo("mine", 8)
    base = {"datasets": ["x"]}
    assert resolve_clip(config_from_dict(base), lite0) is None
    assert resolve_clip(config_from_dict({**base, "clip": 12.5}), unknown) == 12.5
    assert resolve_clip(config_from_dict({**base, "secure": True}), lite0) == \
        default_clip_norm(lite0)
    with pytest.raises(ConfigError, match=r"secure = true needs a clipping bound, and encoder "
                       r"'mine' has no default one; set clip = R in the experiment config"):
        resolve_clip(config_from_dict({**base, "secure": True}), unknown)


def test_heads_for_mode() -> None:
    heads = ("nb", "lda", "qda", "fedcgs")
    assert heads_for_mode(heads, "full") == list(heads)
    assert heads_for_mode(heads, "pooled") == ["nb", "lda", "fedcgs"]
    assert heads_for_mode(heads, "diag") == ["nb"]


def test_mean_std_and_format() -> None:
    assert mean_std([0.5]) == (0.5, 0.0)
    m, s = mean_std([0.5, 0.7])
    assert m == pytest.approx(0.6) and s == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert fmt_pct([0.5, 0.7]) == "60.00 ± 14.14"


def _rec(head: str, alpha: float, clients: int, seed: int, acc: float) -> dict[str, object]:
    return {
        "dataset": "d",
        "encoder": "e",
        "mode": "full",
        "projection_dim": None,
        "alpha": alpha,
        "clients": clients,
        "seed": seed,
        "head": head,
        "accuracy": acc,
        "upload_bytes_per_client": 1000,
        "fit_seconds": 0.1,
    }


def test_tables_and_invariance() -> None:
    recs = [
        _rec("lda", a, k, s, 0.8 + 0.01 * s) for a in (0.1, 0.5) for k in (10, 100) for s in (0, 1)
    ]
    recs += [_rec("nb", 0.1, 10, 0, 0.5), _rec("nb", 0.5, 10, 0, 0.6)]
    recs.append(
        {
            "dataset": "d",
            "encoder": "e",
            "mode": "reference",
            "projection_dim": None,
            "alpha": None,
            "clients": None,
            "seed": None,
            "head": "logreg",
            "accuracy": 0.9,
            "fit_seconds": 1.0,
            "upload_bytes_per_client": None,
        }
    )
    md = accuracy_tables(recs)
    assert "| lda | 80.50 ± 0.71 |" in md and "*logreg (centralised)* | 90.00" in md
    inv = invariance_summary(recs)
    assert "| d | e | full | - | lda | 0.0000 |" in inv
    assert "| d | e | full | - | nb | 10.0000 |" in inv


def test_update_section_replaces_only_its_block(tmp_path: Path) -> None:
    p = tmp_path / "B.md"
    update_section(p, "a", "first")
    update_section(p, "b", "second")
    update_section(p, "a", "third")
    text = p.read_text()
    assert "third" in text and "first" not in text and "second" in text
    assert text.index("third") < text.index("second")
    assert markdown_table(["x"], [[1]]) == "| x |\n|---|\n| 1 |"


def test_references_on_gaussian_data() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=5, n=300)
    xt, yt = gaussian_mixture(0, num_classes=3, dim=5, n=300)
    lr = logreg_reference(x, y, xt, yt, cs=(0.1, 1.0), folds=2)
    assert lr.accuracy > 0.8 and lr.details["C"] in (0.1, 1.0)
    assert sklearn_lda_reference(x, y, xt, yt).accuracy > 0.8


def test_config_dataclass_is_frozen() -> None:
    cfg = ExperimentConfig(datasets=("x",))
    with pytest.raises(AttributeError):
        cfg.name = "y"  # type: ignore[misc]


def test_reference_results_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ghofl.bench.references as refs

    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=120)
    first = refs.run_reference("sklearn_lda", x, y, x, y, cache_dir=tmp_path)

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("recomputed")

    monkeypatch.setattr(refs, "sklearn_lda_reference", boom)
    again = refs.run_reference("sklearn_lda", x, y, x, y, cache_dir=tmp_path)
    assert again == first
    with pytest.raises(AssertionError, match="recomputed"):  # other data: a new key
        refs.run_reference("sklearn_lda", x[:-1], y[:-1], x, y, cache_dir=tmp_path)


def test_resume_accepts_configs_saved_before_new_keys_existed() -> None:
    from ghofl.bench.runner import _same_config

    cfg = config_from_dict({"datasets": ["cifar10"], "alphas": [0.1]})
    old = cfg.to_dict()
    del old["feature_transform"]  # a results.json written before this key existed
    assert _same_config(old, cfg)
    assert not _same_config({**old, "alphas": [0.5]}, cfg)
    assert not _same_config(None, cfg)
