"""The main job behind ``ghofl demo``: what a reader of the method wants to see, in a few minutes.

On CIFAR-10 (a stratified subset) embedded once by EfficientNet-Lite0, with 10 Dirichlet clients:

(a) every registered head's accuracy for α ∈ {0.05, 0.1, 0.5} (upload mode ``full``): flat
    lines, since the aggregated statistics do not depend on how the data is split;
(b) FedAvg of a linear softmax head on the same clients (α = 0.1), accuracy after every round,
    against the one-shot heads (in process: :func:`ghofl.baselines.fedavg_rounds`);
(c) accuracy against the bytes a client uploads, over upload modes (diag, pooled, full) and
    public projections (none, k = 256, k = 64);
(d) the tables, with two centralised probes on the same features (logistic regression with a
    fixed C, scikit-learn's shrinkage LDA).

Everything after the encoding runs with one BLAS thread (see :func:`_one_blas_thread`).

The federations go through :func:`ghofl.bench.runner.run_experiment` (three small grids sharing
one copy of the features), so their records have the runner's format; everything lands in
``out/`` (``results.json``, ``results.md``, three PNGs; the grids' own files in ``out/runs/``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench.config import ExperimentConfig
from ghofl.bench.features import Features
from ghofl.bench.report import write_json
from ghofl.errors import ConfigError

__all__ = [
    "DEMO_ALPHAS",
    "DEMO_LOGREG_C",
    "DEMO_TEST_PER_CLASS",
    "DEMO_TRAIN_PER_CLASS",
    "demo_configs",
    "fedavg_curve",
    "resolve_demo_data",
    "run_demo",
]

Log = Callable[[str], None]

DEMO_TRAIN_PER_CLASS = 300
DEMO_TEST_PER_CLASS = 100
DEMO_CLIENTS = 10
DEMO_ALPHAS = (0.05, 0.1, 0.5)
#: α of the upload-size sweep and of the FedAvg comparison
DEMO_ALPHA = 0.1
DEMO_PROJECTIONS = (0, 256, 64)
DEMO_FEDAVG_ROUNDS = 50
DEMO_FEDAVG_LRS = (0.03, 0.1, 0.3, 1.0)
#: C of the demo's logistic-regression probe: the value 3-fold cross-validation picks on the
#: demo's training subset among 1e-3, 3e-3, 1e-2, 3e-2 (benchmarks/bench_demo.py re-runs that
#: search and reports both), fixed here so a cold demo fits one probe instead of thirteen.
DEMO_LOGREG_C = 3e-3


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Limit BLAS to one thread.

    On a busy 2-core machine a second BLAS thread mostly spins: the d × d factorisations of the
    heads, FedAvg's small products and the probes then take several times longer than with one
    thread, for identical results.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def resolve_demo_data(
    data_dir: str | Path | None = None,
    *,
    download: bool = True,
    progress: bool = True,
    log: Log | None = None,
) -> str | None:
    """The data directory the demo reads CIFAR-10 from.

    ``None`` means the cache, where the archive was downloaded.

    In order: ``cifar10.zip`` (or ``cifar10/``) in ``data_dir`` (default ``GHOFL_DATA_DIR``),
    the official ``cifar-10-python.tar.gz`` there or in the cache, else a download of that
    archive into the cache (progress bar, MD5 check) unless ``download`` is False.

    Raises
    ------
    DataError
        Nothing found and the download impossible or refused: the message says what to
        download and where to put it.
    """
    from ghofl.data.cifar_archive import (
        cached_archive_path,
        cifar10_url,
        ensure_cifar10_archive,
        find_cifar10_archive,
        manual_download_hint,
    )
    from ghofl.data.registry import default_data_dir
    from ghofl.errors import DataError

    say = log or (lambda _m: None)
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if root is not None and root.is_dir() and (
        (root / "cifar10.zip").exists() or (root / "cifar10").exists()
    ):
        return str(root)
    usable_root = root if root is not None and root.is_dir() else None
    if find_cifar10_archive(usable_root) is None:
        if not download:
            raise DataError(f"CIFAR-10 was not found and --no-download was given; "
                            f"{manual_download_hint(usable_root)}")
        say(f"CIFAR-10 not found{f' in {root}' if root is not None else ''}; downloading "
            f"{cifar10_url()} to {cached_archive_path()} (about 163 MiB, once)")
        ensure_cifar10_archive(usable_root, progress=progress)
    return None if usable_root is None else str(usable_root)


def demo_configs(
    *,
    train_per_class: int = DEMO_TRAIN_PER_CLASS,
    test_per_class: int = DEMO_TEST_PER_CLASS,
    resolution: int = 224,
    backend: str = "onnx",
    data_dir: str | None = None,
    heads: tuple[str, ...] | None = None,
    head_params: dict[str, dict[str, Any]] | None = None,
) -> dict[str, ExperimentConfig]:
    """The demo's three grids, by name.

    ``alpha`` (mode full, α ∈ DEMO_ALPHAS), ``upload`` (modes diag and pooled × DEMO_PROJECTIONS,
    α = 0.1) and ``projection`` (mode full under the projections other than none, α = 0.1);
    ``heads=None`` means every registered head.
    """
    from ghofl.heads.registry import available_heads

    common: dict[str, Any] = {
        "datasets": ("cifar10",),
        "encoders": ("efficientnet-lite0",),
        "resolution": resolution,
        "backend": backend,
        "clients": (DEMO_CLIENTS,),
        "seeds": (0,),
        "heads": tuple(heads) if heads else tuple(available_heads()),
        "head_params": dict(head_params or {}),
        "train_per_class": train_per_class,
        "test_per_class": test_per_class,
        "data_dir": data_dir,
        "references": (),
    }
    projected = tuple(k for k in DEMO_PROJECTIONS if k)
    return {
        "alpha": ExperimentConfig(name="demo: accuracy vs alpha", alphas=DEMO_ALPHAS,
                                  modes=("full",), projection_dims=(0,), **common),
        "upload": ExperimentConfig(name="demo: upload modes", alphas=(DEMO_ALPHA,),
                                   modes=("diag", "pooled"), projection_dims=DEMO_PROJECTIONS,
                                   **common),
        "projection": ExperimentConfig(name="demo: projections", alphas=(DEMO_ALPHA,),
                                       modes=("full",), projection_dims=projected, **common),
    }


def fedavg_curve(
    feats: Features,
    *,
    alpha: float = DEMO_ALPHA,
    clients: int = DEMO_CLIENTS,
    seed: int = 0,
    rounds: int = DEMO_FEDAVG_ROUNDS,
    lrs: tuple[float, ...] = DEMO_FEDAVG_LRS,
    select_rounds: int = 10,
) -> dict[str, Any]:
    """FedAvg of a linear softmax head, test accuracy after every round.

    It runs on the clients of the one-shot federation with the same (α, clients, seed).

    The learning rate is the one of ``lrs`` whose ``select_rounds``-round run, trained on 90% of
    each client's rows, scores best on the other 10% (no test data is used to choose it).

    Returns
    -------
    dict
        ``alpha``, ``clients``, ``seed``, ``lr``, ``lr_scores``, ``accuracy`` (list of
        ``rounds + 1`` floats, round 0 = zero weights), ``upload_bytes_per_round`` (one client's
        weights, float64), ``seconds``.
    """
    from ghofl.baselines import fedavg_rounds, softmax_accuracy
    from ghofl.baselines.fedavg import SoftmaxParams
    from ghofl.data.partition import dirichlet_partition

    if rounds < 1 or not lrs:
        raise ConfigError(f"FedAvg needs rounds >= 1 and a learning rate; got rounds={rounds}")
    t0 = time.perf_counter()
    c = len(feats.classes)
    x = np.asarray(feats.x_train, dtype=np.float64)
    y = feats.y_train
    parts = dirichlet_partition(y, clients, alpha, seed)
    rng = np.random.default_rng(seed)
    fit_parts, held = [], []
    for idx in parts:
        idx = rng.permutation(idx)
        cut = idx.size // 10 if idx.size >= 10 else 0
        held.append(idx[:cut])
        fit_parts.append(idx[cut:])
    held_idx = np.concatenate(held)
    scores: dict[str, float] = {}
    acc: list[float] = []
    with _one_blas_thread():
        if len(lrs) > 1 and held_idx.size:
            for lr in lrs:
                p = fedavg_rounds(x, y, fit_parts, c, rounds=select_rounds, lr=lr, seed=seed)
                scores[str(lr)] = softmax_accuracy(p, x[held_idx], y[held_idx])
        best = max(lrs, key=lambda v: scores.get(str(v), 0.0)) if scores else lrs[0]

        def record(_r: int, params: SoftmaxParams) -> None:
            acc.append(softmax_accuracy(params, feats.x_test, feats.y_test))

        final = fedavg_rounds(x, y, parts, c, rounds=rounds, lr=best, seed=seed,
                              on_round=record)
    return {
        "alpha": alpha,
        "clients": clients,
        "seed": seed,
        "lr": best,
        "lr_scores": scores,
        "select_rounds": select_rounds,
        "accuracy": acc,
        "upload_bytes_per_round": final.nbytes,
        "seconds": time.perf_counter() - t0,
    }


def _reference_records(feats: Features, logreg_c: float) -> list[dict[str, Any]]:
    from ghofl.bench.references import run_reference

    out = []
    with _one_blas_thread():
        for name in ("logreg", "sklearn_lda"):
            r = run_reference(name, feats.x_train, feats.y_train, feats.x_test, feats.y_test,
                              logreg_cs=(logreg_c,) if name == "logreg" else None)
            out.append({
                "dataset": feats.dataset, "encoder": feats.encoder_name, "mode": "reference",
                "projection_dim": None, "alpha": None, "clients": None, "seed": None,
                "head": name, "accuracy": r.accuracy, "fit_seconds": r.fit_seconds,
                "upload_bytes_per_client": None, "details": r.details,
                "n_train": len(feats.y_train), "n_test": len(feats.y_test),
            })
    return out


def run_demo(
    out_dir: str | Path,
    *,
    train_per_class: int = DEMO_TRAIN_PER_CLASS,
    test_per_class: int = DEMO_TEST_PER_CLASS,
    resolution: int = 224,
    backend: str = "onnx",
    data_dir: str | None = None,
    heads: tuple[str, ...] | None = None,
    head_params: dict[str, dict[str, Any]] | None = None,
    rounds: int = DEMO_FEDAVG_ROUNDS,
    logreg_c: float = DEMO_LOGREG_C,
    progress: bool = False,
    log: Log | None = None,
) -> dict[str, Any]:
    """Run the demo (see the module docstring) and write ``out_dir``.

    Returns
    -------
    dict
        ``records`` (runner records of the three grids, then the two references), ``fedavg``
        (:func:`fedavg_curve`), ``seconds`` (per stage and ``total``), ``n_train``,
        ``n_test``, ``plots`` (paths written).
    """
    from ghofl.bench.runner import run_experiment

    say = log or (lambda _m: None)
    out = Path(out_dir)
    t_start = time.perf_counter()
    cfgs = demo_configs(train_per_class=train_per_class, test_per_class=test_per_class,
                        resolution=resolution, backend=backend, data_dir=data_dir, heads=heads,
                        head_params=head_params)
    from ghofl.bench.features import load_features

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    first = cfgs["alpha"]
    memo: dict[tuple[str, str], Features] = {
        (str(first.datasets[0]), first.encoders[0]): load_features(
            first.datasets[0], first.encoders[0], first, progress=progress, log=say)
    }
    seconds["features"] = time.perf_counter() - t0
    records: list[dict[str, Any]] = []
    feats = next(iter(memo.values()))
    with _one_blas_thread():
        for name, cfg in cfgs.items():
            t0 = time.perf_counter()
            records += run_experiment(cfg, out / "runs" / name, progress=progress, log=say,
                                      features=memo, plots=False)
            seconds[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        say(f"centralised references (logistic regression with C = {logreg_c:g}, "
            "shrinkage LDA)")
        records += _reference_records(feats, logreg_c)
        seconds["references"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        say(f"FedAvg: {rounds} rounds on the same {DEMO_CLIENTS} clients (alpha {DEMO_ALPHA})")
        fedavg = fedavg_curve(feats, rounds=rounds)
        seconds["fedavg"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - t_start
    result: dict[str, Any] = {
        "records": records, "fedavg": fedavg, "seconds": seconds,
        "n_train": int(feats.y_train.size), "n_test": int(feats.y_test.size),
        "dataset_key": feats.dataset, "encoder": feats.encoder_name,
    }
    from ghofl.bench.tables import demo_markdown

    (out / "results.md").write_text(demo_markdown(result))
    try:
        from ghofl.bench.plots import write_demo_plots

        result["plots"] = [str(p) for p in write_demo_plots(records, fedavg, out)]
    except ImportError as exc:  # matplotlib missing: tables still written
        say(f"plots skipped: {exc}")
        result["plots"] = []
    write_json(out / "results.json", result)
    return result
