"""``ghofl run`` (experiment grids from a TOML config) and ``ghofl demo`` (the main job)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ghofl.bench.demo import DEMO_FEDAVG_ROUNDS, DEMO_TEST_PER_CLASS, DEMO_TRAIN_PER_CLASS
from ghofl.cli._options import ParamOption
from ghofl.cli.app import app


def _echo(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command("run")
def run(
    config: Annotated[
        Path, typer.Option("--config", help="Experiment TOML (see ghofl.bench.config).")
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Output folder: results.json, results.md, *.png.")
    ],
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip federations already in OUT/results.json.")
    ] = False,
    progress: Annotated[
        bool, typer.Option("--progress", help="Show progress bars (encoding, training).")
    ] = False,
) -> None:
    """Run a grid of one-shot federations and write results, tables and plots.

    The grid is dataset × encoder × mode × projection × α × clients × seeds; the output is tidy
    results, mean ± std tables and plots.
    """
    from ghofl.bench.config import load_config
    from ghofl.bench.runner import run_experiment

    cfg = load_config(config)
    t0 = time.perf_counter()
    run_experiment(cfg, out, resume=resume, progress=progress, log=_echo)
    typer.echo((out / "results.md").read_text())
    typer.echo(
        f"wrote {out / 'results.json'}, {out / 'results.md'} and plots "
        f"in {time.perf_counter() - t0:.0f} s"
    )


@app.command("demo")
def demo(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("results/demo"),
    train_per_class: Annotated[
        int,
        typer.Option(
            "--train-per-class",
            help="Training images per class (0 = all 5,000; encoding all takes ~10 min).",
        ),
    ] = DEMO_TRAIN_PER_CLASS,
    test_per_class: Annotated[
        int, typer.Option("--test-per-class", help="Test images per class (0 = all 1,000).")
    ] = DEMO_TEST_PER_CLASS,
    resolution: Annotated[
        int, typer.Option("--resolution", help="Encoder input resolution.")
    ] = 224,
    backend: Annotated[
        str, typer.Option("--backend", help="Encoder backend: onnx or torch.")
    ] = "onnx",
    heads: Annotated[
        str, typer.Option("--heads", help="Comma-separated registered heads, or 'all'.")
    ] = "all",
    param: ParamOption = None,
    rounds: Annotated[
        int, typer.Option("--rounds", help="FedAvg rounds of the multi-round comparison.")
    ] = DEMO_FEDAVG_ROUNDS,
    download: Annotated[
        bool,
        typer.Option(
            "--download/--no-download",
            help="Download the official CIFAR-10 archive when no copy is found.",
        ),
    ] = True,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show progress bars.")
    ] = True,
) -> None:
    """The main job: CIFAR-10 through EfficientNet-Lite0 (ImageNet weights), 10 clients.

    Every head against Dirichlet α, FedAvg's rounds on the same clients, accuracy against upload
    size; prints the tables and writes three PNG plots.

    CIFAR-10 comes from GHOFL_DATA_DIR (cifar10.zip, or the official cifar-10-python.tar.gz),
    else from the cache, else the official archive is downloaded once (MD5-checked).
    """
    from ghofl.bench.demo import resolve_demo_data, run_demo
    from ghofl.cli.io import parse_param_options
    from ghofl.heads.registry import parse_head_list

    names = parse_head_list(heads)
    params = parse_param_options(param, names)
    if rounds < 1:
        raise typer.BadParameter("--rounds must be >= 1")
    t0 = time.perf_counter()
    data_dir = resolve_demo_data(download=download, progress=progress, log=_echo)
    result = run_demo(out, train_per_class=train_per_class, test_per_class=test_per_class,
                      resolution=resolution, backend=backend, data_dir=data_dir,
                      heads=tuple(names), head_params=params, rounds=rounds,
                      progress=progress, log=_echo)
    typer.echo("")
    typer.echo((out / "results.md").read_text())
    typer.echo(f"plots: {', '.join(result['plots']) or 'none (matplotlib missing)'}")
    typer.echo(
        f"full results: {out / 'results.md'}, {out / 'results.json'} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
