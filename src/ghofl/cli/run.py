"""``ghofl run`` (experiment grids from a TOML config) and ``ghofl demo`` (the main job)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ghofl.cli.app import app

DEMO_TRAIN_PER_CLASS = 1000
DEMO_TEST_PER_CLASS = 300


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
    """Run a grid of one-shot federations (dataset × encoder × mode × projection × α × clients ×
    seeds) and write tidy results, mean ± std tables and plots."""
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
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show progress bars.")
    ] = True,
) -> None:
    """The main job: CIFAR-10, EfficientNet-Lite0 (ImageNet weights), 10 clients, Dirichlet α = 0.1,
    every head, centralised references; prints the accuracy table and writes a PNG plot."""
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.runner import run_experiment
    from ghofl.bench.tables import demo_table
    from ghofl.data.registry import default_data_dir
    from ghofl.errors import DataError

    if default_data_dir() is None:
        raise DataError(
            "the demo needs CIFAR-10: set GHOFL_DATA_DIR to a folder holding cifar10.zip "
            "(ImageFolder layout cifar10/{train,test}/<class>/*.jpg), e.g. "
            "`export GHOFL_DATA_DIR=../shared/data`"
        )
    cfg = ExperimentConfig(
        name="demo: CIFAR-10 / EfficientNet-Lite0 / 10 clients / alpha 0.1",
        datasets=("cifar10",),
        encoders=("efficientnet-lite0",),
        resolution=resolution,
        alphas=(0.1,),
        clients=(10,),
        seeds=(0,),
        train_per_class=train_per_class,
        test_per_class=test_per_class,
        references=("logreg", "sklearn_lda"),
    )
    t0 = time.perf_counter()
    records = run_experiment(cfg, out, progress=progress, log=_echo)
    typer.echo("")
    typer.echo(demo_table(records))
    pngs = sorted(out.glob("*.png"))
    typer.echo(f"\nplots: {', '.join(str(p) for p in pngs)}")
    typer.echo(
        f"full results: {out / 'results.md'}, {out / 'results.json'} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
