"""PNG plots of experiment records (matplotlib, imported lazily; the ``bench`` extra)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from ghofl.bench.tables import mean_std
from ghofl.errors import require_extra


def write_plots(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Accuracy per head vs α, and accuracy vs upload bytes; returns the files written."""
    require_extra("matplotlib", "bench")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    fed = [r for r in records if r["mode"] != "reference"]
    refs = [r for r in records if r["mode"] == "reference"]
    for (ds, enc), recs in _group(fed, ("dataset", "encoder")).items():
        base = [r for r in recs if r["mode"] == recs[0]["mode"] and not r["projection_dim"]]
        k0 = min(r["clients"] for r in base) if base else None
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for head, hr in _group([r for r in base if r["clients"] == k0], ("head",)).items():
            pts = sorted(_by(hr, "alpha").items())
            means = [100 * mean_std(v)[0] for _, v in pts]
            errs = [100 * mean_std(v)[1] for _, v in pts]
            ax.errorbar([a for a, _ in pts], means, yerr=errs, marker="o", capsize=3, label=head[0])
        for ref in refs:
            if ref["dataset"] == ds and ref["encoder"] == enc:
                ax.axhline(100 * ref["accuracy"], ls="--", lw=1, color="gray")
                ax.annotate(
                    f"{ref['head']} (centralised)",
                    (0.01, 100 * ref["accuracy"]),
                    xycoords=("axes fraction", "data"),
                    va="top",
                    fontsize=8,
                    color="gray",
                )
        ax.set_xscale("log")
        alphas = sorted({r["alpha"] for r in base})
        ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
        ax.minorticks_off()
        written.append(
            _finish(
                fig,
                ax,
                "Dirichlet α (label skew; smaller = more skewed)",
                f"{ds} / {enc}: one-shot heads vs α ({k0} clients)",
                out_dir / f"accuracy_vs_alpha_{_slug(ds)}_{_slug(enc)}.png",
            )
        )

        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors: dict[str, Any] = {}
        styles = {"full": "-", "pooled": "--", "diag": ":"}
        for (head, mode), hr in _group(recs, ("head", "mode")).items():
            pts = sorted(_by(hr, "upload_bytes_per_client").items())
            line = ax.plot(
                [b / 1e6 for b, _ in pts],
                [100 * mean_std(v)[0] for _, v in pts],
                marker="o",
                ls=styles.get(mode, "-"),
                color=colors.get(head),
                label=f"{head} ({mode})",
            )
            colors.setdefault(head, line[0].get_color())

        ax.set_xscale("log")
        written.append(
            _finish(
                fig,
                ax,
                "upload per client (MB, log scale)",
                f"{ds} / {enc}: accuracy vs upload size",
                out_dir / f"accuracy_vs_bytes_{_slug(ds)}_{_slug(enc)}.png",
            )
        )
    return written


def _finish(fig: Any, ax: Any, xlabel: str, title: str, path: Path) -> Path:
    """Label an accuracy plot, save it as PNG and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _group(
    records: list[dict[str, Any]], keys: tuple[str, ...]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _by(records: list[dict[str, Any]], key: str) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = defaultdict(list)
    for r in records:
        out[r[key]].append(r["accuracy"])
    return out


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in Path(str(s)).name)
