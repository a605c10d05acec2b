"""``ghofl simulate``: a whole one-shot federation in one process.

The JSON written by ``--json`` is :meth:`ghofl.simulation.SimulationResult.to_dict`::

    {"heads": {"lda": {"accuracy": 0.93, "fit_seconds": 0.01, "predict_seconds": 0.001,
                       "params": {"shrinkage": 0.05, ...}}, ...},
     "clients": 10, "alpha": 0.1, "seed": 0, "mode": "full",
     "projection_dim": null, "projection_seed": null,
     "upload_bytes_per_client": 12345, "n_train": 5000, "n_test": 1000, "num_classes": 10,
     "classes": ["0", ...],
     "stage_seconds": {"partition": ..., "client_stats": ..., "client_stats_max": ...,
                       "aggregate": ..., "fit/lda": ..., "evaluate/lda": ...},
     "client_sizes": [512, ...], "ghofl_version": "0.1.0"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ghofl.cli.app import app
from ghofl.cli.io import (
    check_mode,
    check_output_file,
    load_embeddings,
    parse_param_options,
    resolve_classes,
    table,
    write_json,
)
from ghofl.cli.model_cmds import DEFAULT_HEADS
from ghofl.errors import ConfigError
from ghofl.heads.registry import parse_head_list
from ghofl.simulation import simulate_federation


@app.command("simulate")
def simulate(
    train: Annotated[Path, typer.Option("--train", help="Training NPZ with x (n, d), y (n,).")],
    test: Annotated[Path, typer.Option("--test", help="Test NPZ with x (m, d), y (m,).")],
    clients: Annotated[int, typer.Option("--clients", help="Number of clients K.")],
    alpha: Annotated[float, typer.Option(
        "--alpha", help="Dirichlet concentration of the label skew (e.g. 0.1).")],
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed of the partition and of every head that takes one.")] = 0,
    heads: Annotated[str, typer.Option(
        "--heads", help="Comma-separated registered heads, or 'all'.")] = DEFAULT_HEADS,
    mode: Annotated[str, typer.Option("--mode", help="Upload mode: full, pooled or diag.")]
        = "full",
    projection_dim: Annotated[int | None, typer.Option(
        "--projection-dim", help="Dimension of a public random projection.")] = None,
    projection_seed: Annotated[int | None, typer.Option(
        "--projection-seed", help="Public seed of the projection (default 0).")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Head hyperparameter HEAD.KEY=VALUE (repeatable).")] = None,
    classes: Annotated[str | None, typer.Option(
        "--classes", help="Comma-separated class names (default: from the archives).")] = None,
    num_classes: Annotated[int | None, typer.Option(
        "--num-classes", help="Number of classes (default: from the archives).")] = None,
    min_per_client: Annotated[int, typer.Option(
        "--min-per-client", help="Redraw the partition until every client has this many.")]
        = 0,
    progress: Annotated[bool, typer.Option(
        "--progress", help="Show progress of trainable heads.")] = False,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the full result as JSON here.")] = None,
) -> None:
    """Simulate a Dirichlet-partitioned one-shot federation and report accuracy per head.

    Every client computes statistics from its own rows only; the server fits each head from
    the aggregate and scores it on the test set.
    """
    m = check_mode(mode)
    if projection_seed is not None and projection_dim is None:
        raise ConfigError("--projection-seed needs --projection-dim; give both or neither")
    names = parse_head_list(heads)
    params = parse_param_options(param, names)
    if json_out is not None:
        check_output_file(json_out, "--json")
    tr = load_embeddings(train, "--train")
    te = load_embeddings(test, "--test")
    class_names = resolve_classes(classes, num_classes, [tr, te])
    result = simulate_federation(
        tr.x, tr.y, te.x, te.y,
        classes=list(class_names), clients=clients, alpha=alpha, seed=seed, heads=names,
        head_params=params, mode=m, projection_dim=projection_dim,
        projection_seed=projection_seed or 0, min_per_client=min_per_client, progress=progress,
    )
    if json_out is not None:
        write_json(json_out, result.to_dict())
    typer.echo(
        f"{result.clients} clients, alpha={result.alpha:g}, seed={result.seed}, mode "
        f"{result.mode}, {result.upload_bytes_per_client} bytes uploaded per client"
    )
    typer.echo(table(["head", "accuracy", "fit_seconds"],
                     [[n, r.accuracy, r.fit_seconds] for n, r in result.heads.items()]))
