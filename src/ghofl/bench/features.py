"""Embedded train/test features for one (dataset, encoder) cell of an experiment grid.

Embeddings go through the on-disk cache (:func:`ghofl.client.embed.embed_dataset_cached`), so
a second run never re-encodes. In the simulated federation each client reads only the rows of
its own shard from this matrix, which is what a real client computes by encoding its own data:
the server side only ever sees the aggregated statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench.config import ExperimentConfig
from ghofl.data.by_path import DatasetSpec
from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo

TEXT_ENCODERS = ("minilm", "all-minilm-l6-v2")


@dataclass(frozen=True)
class Features:
    """Embedded splits of one dataset under one encoder."""

    dataset: str
    encoder_name: str
    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    classes: tuple[str, ...]
    encoder_info: EncoderInfo
    note: str = ""


def dataset_label(dataset: str | DatasetSpec) -> str:
    """Name of a config dataset entry in records and tables (a spec's ``label``)."""
    return dataset.label if isinstance(dataset, DatasetSpec) else str(dataset)


def is_text_encoder_name(name: str) -> bool:
    """Whether ``name`` is a registered text encoder (or an ``hf:`` text model)."""
    return name.lower() in TEXT_ENCODERS or name.strip().lower().startswith("hf:")


def load_features(
    dataset: str | DatasetSpec,
    encoder_name: str,
    cfg: ExperimentConfig,
    *,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> Features:
    """Embed (or read from the cache) the train and test splits of ``dataset``.

    ``dataset`` is a name, a path or a :class:`~ghofl.data.by_path.DatasetSpec`; data given
    by path is cached under a key holding a fingerprint of its content
    (:meth:`DatasetSpec.cache_key`), so a changed file is embedded again.
    """
    from ghofl.client.embed import embed_dataset_cached
    from ghofl.client.encoders import get_encoder
    from ghofl.data.registry import available_datasets, load_dataset, subsample
    from ghofl.data.text import TextDataset

    say = log or (lambda _m: None)
    label = dataset_label(dataset)
    spec = dataset if isinstance(dataset, DatasetSpec) else None
    if spec is None and str(dataset).lower() not in available_datasets() \
            and Path(str(dataset)).expanduser().exists():
        spec = DatasetSpec(str(dataset))
    splits = {}
    for split in ("train", "test"):
        splits[split] = load_dataset(spec or dataset, split, data_dir=cfg.data_dir)
    # named sources with their own key (the CIFAR-10 python archive: ``cifar10-python``)
    key = spec.cache_key() if spec is not None else getattr(splits["train"], "cache_key", None)
    is_text = isinstance(splits["train"], TextDataset)
    if is_text != is_text_encoder_name(encoder_name):
        kind = "a text" if is_text else "an image"
        raise ConfigError(
            f"dataset {label!r} is {kind} dataset but encoder {encoder_name!r} is not "
            f"{'a text' if is_text else 'an image'} encoder; pair text datasets with 'minilm' "
            "and image datasets with an image encoder (e.g. 'efficientnet-lite0')"
        )
    encoder = get_encoder(encoder_name, resolution=cfg.resolution, backend=cfg.backend)
    out: dict[str, tuple[NDArray[np.float32], NDArray[np.int64]]] = {}
    for split, per_class in (("train", cfg.train_per_class), ("test", cfg.test_per_class)):
        src: Any = splits[split]
        idx = subsample(src.labels, per_class=per_class, seed=0) if per_class else None
        n = len(src.labels) if idx is None else len(idx)
        blank = getattr(src, "blank_lines", 0)
        say(
            f"embedding {label}/{split}: {n} items with {encoder_name} "
            "(cached after the first run)"
            + (f"; the reader skipped {blank} blank lines" if blank else "")
        )
        out[split] = embed_dataset_cached(
            src if key is not None else str(dataset), split, encoder, idx, key=key,
            data_dir=cfg.data_dir, progress=progress,
        )
    from ghofl.client.transforms import apply_feature_transform, transformed_info

    ft = cfg.feature_transform
    return Features(
        dataset=label,
        encoder_name=encoder_name if ft == "none" else f"{encoder_name}+{ft}",
        x_train=apply_feature_transform(out["train"][0], ft),
        y_train=out["train"][1],
        x_test=apply_feature_transform(out["test"][0], ft),
        y_test=out["test"][1],
        classes=tuple(splits["train"].classes),
        encoder_info=transformed_info(encoder.info, ft),
        note=getattr(splits["train"], "note", ""),
    )
