"""``ghofl fit``, ``ghofl evaluate`` and ``ghofl heads``: heads fitted from an aggregate."""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ghofl.cli.app import app
from ghofl.cli.io import (
    MANIFEST,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    atomic_directory,
    check_output_dir,
    load_embeddings,
    parse_param_options,
    read_stats,
    table,
    write_json,
)
from ghofl.errors import InputError
from ghofl.heads.base import Head
from ghofl.heads.registry import available_heads, head_class, load_head, parse_head_list, save_head
from ghofl.simulation import build_heads, check_labelled_embeddings, head_defaults, to_jsonable
from ghofl.stats.client_stats import ClientStats

DEFAULT_HEADS = "nb,lda,qda,fedcgs"


@app.command("fit")
def fit(
    total: Annotated[Path, typer.Argument(help="Aggregate statistics file (.ghs).")],
    out: Annotated[Path, typer.Option("--out", help="Model directory to write.")],
    heads: Annotated[str, typer.Option(
        "--heads", help="Comma-separated registered heads, or 'all'.")] = DEFAULT_HEADS,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Head hyperparameter HEAD.KEY=VALUE (repeatable), e.g. "
        "lda.shrinkage=auto.")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", help="Seed for every head that takes one (unless set with --param).")] = None,
    progress: Annotated[bool, typer.Option(
        "--progress", help="Report progress of each head on stderr.")] = False,
) -> None:
    """Fit heads from aggregated statistics; write one HEAD.ghh per head and manifest.json.

    The directory is written atomically: an existing model directory is replaced only after
    every head was fitted and saved.
    """
    names = parse_head_list(heads)
    params = parse_param_options(param, names)
    check_output_dir(out)
    stats = read_stats(total)
    models = build_heads(names, params, seed=seed, progress=progress, mode=stats.mode)
    entries: dict[str, dict[str, Any]] = {}
    with atomic_directory(out) as tmp:
        for name, head in models.items():
            if progress:
                typer.echo(f"fitting {name}...", err=True)
            t0 = time.perf_counter()
            head.fit_from_stats(stats)
            seconds = time.perf_counter() - t0
            save_head(head, tmp / f"{name}.ghh")
            entries[name] = {"file": f"{name}.ghh", "fit_seconds": seconds,
                             "params": to_jsonable(head.get_params())}
        manifest = _manifest(entries, stats, total)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    typer.echo(table(["head", "fit_seconds", "file"],
                     [[n, e["fit_seconds"], str(out / e["file"])] for n, e in entries.items()]))


def _manifest(
    entries: dict[str, dict[str, Any]], stats: ClientStats, source: Path
) -> dict[str, Any]:
    from ghofl import __version__

    return {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "ghofl_version": __version__,
        "heads": entries,
        "stats": {**stats.meta.to_dict(), "n_samples": stats.n_samples,
                  "counts": stats.counts.tolist(), "source": str(source)},
    }


@app.command("evaluate")
def evaluate(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by `ghofl fit`.")],
    embeddings: Annotated[Path, typer.Option(
        "--embeddings", help="Test NPZ with x (n, d) and y (n,).")],
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the accuracies as JSON here.")] = None,
) -> None:
    """Score every head of a model directory on labelled test embeddings."""
    if json_out is not None and json_out.is_dir():
        raise InputError(f"--json '{json_out}' is a directory; give a file path")
    models = _load_model_dir(model_dir)
    emb = load_embeddings(embeddings, "--embeddings")
    first = next(iter(models.values()))
    classes = first.meta_.classes
    if emb.classes is not None and emb.classes != classes:
        raise InputError(
            f"'{embeddings}' stores the class names {_short(emb.classes)}, which differ from the "
            f"model's {_short(classes)}; evaluate on data labelled with the model's classes"
        )
    if emb.x.ndim == 2 and emb.x.shape[1] != first.n_features_in_:
        raise InputError(
            f"'{embeddings}' has {emb.x.shape[1]}-dimensional embeddings but the model in "
            f"'{model_dir}' expects d={first.n_features_in_}; embed the test set with the "
            "clients' encoder"
        )
    x, y = check_labelled_embeddings(emb.x, emb.y, len(classes), f"'{embeddings}'",
                                     range_hint="the model does not know that class")
    if y.size == 0:
        raise InputError(f"'{embeddings}' holds no samples; accuracy needs at least one")
    results: dict[str, dict[str, Any]] = {}
    for name, head in models.items():
        t0 = time.perf_counter()
        pred = head.predict(x)
        results[name] = {"accuracy": float(np.mean(pred == y)),
                         "n": int(y.size), "predict_seconds": time.perf_counter() - t0}
    if json_out is not None:
        write_json(json_out, {"heads": results, "model_dir": str(model_dir),
                              "embeddings": str(embeddings)})
    typer.echo(table(["head", "accuracy", "n"],
                     [[n, r["accuracy"], r["n"]] for n, r in results.items()]))


def _short(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:5])
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > 5 else f"[{shown}]"


def _load_model_dir(model_dir: Path) -> dict[str, Head]:
    fix = "write it with `ghofl fit`"
    if not model_dir.is_dir():
        raise InputError(
            f"model directory '{model_dir}' does not exist or is not a directory; {fix}"
        )
    path = model_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"'{model_dir}' has no {MANIFEST}, so it is not a ghofl model "
                         f"directory; {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"'{path}' is not valid JSON ({exc}); {fix}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MODEL_FORMAT \
            or not isinstance(manifest.get("heads"), dict) or not manifest["heads"]:
        raise InputError(f"'{path}' is not a ghofl model manifest; {fix}")
    if int(manifest.get("format_version", 0)) > MODEL_FORMAT_VERSION:
        raise InputError(f"'{path}' was written by a newer ghofl; upgrade ghofl")
    models: dict[str, Head] = {}
    for name, entry in manifest["heads"].items():
        file = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(file, str) or Path(file).name != file:
            raise InputError(f"'{path}' lists head {name!r} without a valid file name; {fix}")
        models[name] = load_head(model_dir / file)
    return models


@app.command("heads")
def heads_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """List the registered heads with the upload mode they need and their parameters."""
    rows: list[list[Any]] = []
    info: dict[str, Any] = {}
    for name in available_heads():
        try:
            cls = head_class(name)
            defaults = head_defaults(name)
        except Exception as exc:  # list the other heads; say why this one fails
            reason = f"unavailable: {type(exc).__name__}: {' '.join(str(exc).split())}"
            info[name] = {"available": False, "reason": reason}
            rows.append([name, "-", reason])
            continue
        shown = {k: (None if v is inspect.Parameter.empty else to_jsonable(v))
                 for k, v in defaults.items()}
        info[name] = {"available": True, "min_mode": cls.min_mode, "params": shown}
        rows.append([name, cls.min_mode,
                     ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "-"])
    if as_json:
        json.dump(info, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        typer.echo(table(["head", "min_mode", "parameters (defaults)"], rows))
