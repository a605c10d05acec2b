"""Experiment configuration: a TOML file describing a grid of one-shot federations.

Example (every key except ``datasets`` has a default)::

    name = "cifar10-main"
    datasets = ["cifar10"]               # names (cifar10, trec, sst2, agnews, tiny-imagenet) or
                                          # paths (ImageFolder or Tiny-ImageNet zip/folder)
    encoders = ["efficientnet-lite0"]    # see ghofl.client.encoders.get_encoder
    resolution = 224
    backend = "onnx"                      # or "torch"
    feature_transform = "none"            # or "sqrt", "x+sqrt" (see ghofl.client.transforms)
    alphas = [0.05, 0.1, 0.5]
    clients = [10, 50, 100]
    seeds = [0, 1, 2]
    heads = ["nb", "lda", "qda", "fedcgs", "fishermix", "protohyper"]
    modes = ["full"]
    projection_dims = [0]                 # 0 = no projection
    projection_seed = 0
    projection = "random"                 # or "pca": the encoder's public principal-direction
                                          # basis (ghofl projection-basis; ghofl.stats.projection)
    train_per_class = 0                   # 0 = the whole split; else a stratified subsample
    test_per_class = 0
    references = ["logreg", "sklearn_lda"]
    secure = false                        # true: the secure aggregation protocol
    clip = 0.0                            # per-sample L2 bound R; 0 = none, or the encoder's
                                          # default R when secure = true
    holdout = [0.0]                       # held-out fraction of each client's samples; 0 = none
    preset = "default"                    # head hyperparameters: "default" (from the data) or
                                          # "paper" (fixed values); head_params override them
    transport_dtype = ["float64"]         # or "float32": dtype of the float sums uploaded
    invariance_check = false              # benchmarks/bench_experiments.py: also run other
                                          # partitions and report the heads' accuracy spread

    [head_params.fishermix]
    epochs = 40

Datasets by path: a string that is not a known name is a path (relative to the working
directory): an image layout (folder or .zip with ``train/`` and ``test/`` split folders), a
text file (``<label> <text>`` lines, or ``.csv``/``.tsv`` rows with a label column; its
``test`` split is a stratified 20% held out with seed 0), or a folder holding a ``train`` and
a ``test`` text file. A table says more (keys of :class:`ghofl.data.by_path.DatasetSpec`)::

    datasets = [
        "cifar10",
        {path = "data/reviews/train.tsv", test = "data/reviews/test.tsv", label_column = "label"},
        {path = "data/questions.txt", name = "questions", test_fraction = 0.25, split_seed = 1},
    ]
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ghofl.data.by_path import DatasetSpec
from ghofl.errors import ConfigError
from ghofl.heads.presets import check_preset
from ghofl.heads.registry import available_heads
from ghofl.stats.schema import SCHEMAS

REFERENCES = ("logreg", "sklearn_lda")
#: keys holding lists; every one but ``references`` must be non-empty
_LIST_KEYS = (
    "datasets",
    "encoders",
    "alphas",
    "clients",
    "seeds",
    "heads",
    "modes",
    "projection_dims",
    "references",
    "holdout",
    "transport_dtype",
)


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment grid (see module docstring for the TOML keys)."""

    datasets: tuple[str | DatasetSpec, ...]
    name: str = "experiment"
    encoders: tuple[str, ...] = ("efficientnet-lite0",)
    resolution: int = 224
    backend: str = "onnx"
    feature_transform: str = "none"
    alphas: tuple[float, ...] = (0.1,)
    clients: tuple[int, ...] = (10,)
    seeds: tuple[int, ...] = (0,)
    heads: tuple[str, ...] = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
    modes: tuple[str, ...] = ("full",)
    projection_dims: tuple[int, ...] = (0,)
    projection_seed: int = 0
    projection: str = "random"
    train_per_class: int = 0
    test_per_class: int = 0
    min_per_client: int = 0
    references: tuple[str, ...] = REFERENCES
    head_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    preset: str = "default"
    data_dir: str | None = None
    secure: bool = False
    clip: float = 0.0
    holdout: tuple[float, ...] = (0.0,)
    transport_dtype: tuple[str, ...] = ("float64",)
    invariance_check: bool = False

    def __post_init__(self) -> None:
        _nonempty(self, *(k for k in _LIST_KEYS if k != "references"))
        _check_datasets(self.datasets)
        for a in self.alphas:
            if not a > 0:
                raise ConfigError(f"alphas must be positive numbers; got {a}")
        for k in self.clients:
            if int(k) < 1:
                raise ConfigError(f"clients must be integers >= 1; got {k}")
        known = available_heads()
        for h in self.heads:
            if h not in known:
                raise ConfigError(
                    f"unknown head {h!r} in 'heads'; available heads: {', '.join(known)}"
                )
        for h in self.head_params:
            if h not in known:
                raise ConfigError(
                    f"[head_params.{h}] names an unknown head; available heads: {', '.join(known)}"
                )
        check_preset(self.preset)
        for m in self.modes:
            if m not in SCHEMAS:
                raise ConfigError(f"modes must be among {', '.join(SCHEMAS)}; got {m!r}")
        if not isinstance(self.secure, bool):
            raise ConfigError(f"secure must be true or false; got {self.secure!r}")
        if not isinstance(self.invariance_check, bool):
            raise ConfigError(f"invariance_check must be true or false (measure the partition "
                              f"invariance on this config); got {self.invariance_check!r}")
        if (isinstance(self.clip, bool) or not isinstance(self.clip, int | float)
                or not self.clip >= 0 or self.clip == float("inf")):
            raise ConfigError(
                f"clip must be a finite number >= 0 (0 = no clipping); got {self.clip!r}"
            )
        _check_upload_options(self)
        if self.projection not in ("random", "pca"):
            raise ConfigError(
                f"projection must be 'random' or 'pca'; got {self.projection!r}"
            )
        for p in self.projection_dims:
            if int(p) < 0:
                raise ConfigError(f"projection_dims must be >= 0 (0 = none); got {p}")
        for r in self.references:
            if r not in REFERENCES:
                raise ConfigError(f"unknown reference {r!r}; choose among {', '.join(REFERENCES)}")
        from ghofl.client.transforms import check_feature_transform

        check_feature_transform(self.feature_transform)
        if self.backend not in ("onnx", "torch"):
            raise ConfigError(f"backend must be 'onnx' or 'torch'; got {self.backend!r}")
        if self.resolution < 16:
            raise ConfigError(f"resolution must be >= 16 pixels; got {self.resolution}")
        if self.train_per_class < 0 or self.test_per_class < 0:
            raise ConfigError("train_per_class and test_per_class must be >= 0 (0 = all)")

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dictionary (:func:`dataclasses.asdict`)."""
        return asdict(self)

    def n_cells(self) -> int:
        """Number of federations the grid runs."""
        n = 1
        for v in (
            self.datasets,
            self.encoders,
            self.modes,
            self.projection_dims,
            self.alphas,
            self.clients,
            self.seeds,
            self.holdout,
            self.transport_dtype,
        ):
            n *= len(v)
        return n


def _check_upload_options(cfg: ExperimentConfig) -> None:
    """Check the ``holdout`` fractions (in [0, 0.5]) and ``transport_dtype`` (float64/float32).

    float32 is refused with ``secure``: secure aggregation sends its own fixed-point words.
    """
    from ghofl.server.fields import CONFIG
    from ghofl.server.plan import PlanError, check_transport_dtype
    from ghofl.stats.meta import MAX_HOLDOUT_FRACTION
    from ghofl.stats.transport import TRANSPORT_DTYPES

    for f in cfg.holdout:
        if not 0.0 <= f <= MAX_HOLDOUT_FRACTION:
            raise ConfigError(
                f"holdout must hold fractions in [0, {MAX_HOLDOUT_FRACTION:g}] (0 = no held-out "
                f"section); got {f}"
            )
    for t in cfg.transport_dtype:
        if t not in TRANSPORT_DTYPES:
            raise ConfigError(
                f"transport_dtype must be among {', '.join(TRANSPORT_DTYPES)}; got {t!r}"
            )
        try:
            check_transport_dtype(t, "secure" if cfg.secure else "plain")
        except PlanError as exc:
            raise ConfigError(f"experiment config: {exc.render(CONFIG)}") from None


def _check_datasets(datasets: tuple[str | DatasetSpec, ...]) -> None:
    labels: list[str] = []
    for d in datasets:
        if not isinstance(d, str | DatasetSpec):
            raise ConfigError(
                f"datasets entries must be names, paths or tables like {{path = \"train.txt\"}}; "
                f"got {d!r}"
            )
        labels.append(d.label if isinstance(d, DatasetSpec) else d)
    dup = sorted({n for n in labels if labels.count(n) > 1})
    if dup:
        raise ConfigError(
            f"datasets name {dup[0]!r} more than once; give each table a distinct name = \"...\""
        )


def _dataset_entry(item: Any, source: str, i: int) -> str | DatasetSpec:
    if isinstance(item, DatasetSpec):
        return item
    if isinstance(item, dict):
        return DatasetSpec.from_mapping(item, f"{source}: datasets[{i}]")
    if isinstance(item, str):
        return item
    raise ConfigError(
        f"{source}: datasets[{i}] must be a name, a path or a table like "
        f"{{path = \"train.txt\", test = \"test.txt\"}}; got {item!r}"
    )


def _nonempty(cfg: ExperimentConfig, *names: str) -> None:
    for n in names:
        if not getattr(cfg, n):
            raise ConfigError(f"experiment key {n!r} must be a non-empty list")


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> ExperimentConfig:
    """Build a config from parsed TOML, with errors naming unknown keys and wrong types."""
    fields = set(ExperimentConfig.__dataclass_fields__)
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    if "datasets" not in data:
        raise ConfigError(
            f"{source}: the key 'datasets' is required (e.g. datasets = [\"cifar10\"])"
        )
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key == "datasets":
            items = value if isinstance(value, list | tuple) else [value]
            kw[key] = tuple(_dataset_entry(v, source, i) for i, v in enumerate(items))
        elif key in _LIST_KEYS:
            items = value if isinstance(value, list | tuple) else [value]
            conv = {"alphas": float, "clients": int, "seeds": int, "projection_dims": int,
                    "holdout": float}.get(key, str)
            try:
                kw[key] = tuple(conv(v) for v in items)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{source}: {key} must be a list of {conv.__name__}; got {value!r}"
                ) from None
        elif key == "head_params":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(
                    f"{source}: head_params must be tables like [head_params.fishermix]"
                )
            kw[key] = {k: dict(v) for k, v in value.items()}
        else:
            kw[key] = value
    try:
        return ExperimentConfig(**kw)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"experiment config {str(p)!r} does not exist; check the path")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{str(p)!r} is not valid TOML: {exc}") from None
    return config_from_dict(data, str(p))
