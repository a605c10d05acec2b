"""``ghofl aggregate --dp-epsilon``: the files' total released under central differential privacy.

The server sums the payload files as without DP (one file at a time) and releases the total
through the mechanism of every central-DP front end: the plan of the payloads
(:func:`~ghofl.server.files.payload_plan`) gets the options' :class:`~ghofl.privacy.DPConfig`
and the minimum-count rule's k, and :class:`~ghofl.server.run.FederationServer` noises the
exact sum with :func:`~ghofl.privacy.release_central` (Gaussian noise calibrated to the files'
common clipping bound R, then the post-processing into valid statistics). ``--out`` receives
the post-processed release, a :class:`~ghofl.stats.release.NoisyStats` whose header records
its noise levels (``noise_sigma``), so that ``ghofl fit`` weighs the noise in the heads'
criteria; the exact sum is never written. The privacy report
(:meth:`~ghofl.privacy.PrivateRelease.to_dict`: spent ε and δ, σ per block, post-processing)
is printed and written beside ``--out`` (:func:`~ghofl.cli.io.privacy_report_path`), with the
SHA-256 of the bytes written to ``--out`` (``out_sha256``), by which ``ghofl fit`` checks that a
report belongs to the release it fits and records the report's ``privacy`` in the model::

    {"privacy": {"epsilon_spent": 4.0, "delta_spent": 1e-05, "sigma": {...}, ...},
     "noise": {"source": "os-entropy" | "seed", "seed": null | 7},
     "files": [{"path": "a.ghs", "sha256": "..."}, ...], "out": "total.ghs",
     "out_sha256": "...", "ghofl_version": "..."}

The noise comes from OS entropy, as in the Flower ServerApp, and is not recorded: nobody can
draw it again and subtract it. ``--seed S`` asks for reproducible noise (seeded as ``ghofl
simulate`` seeds its noise); the report then records S, and anyone who knows S can remove
the noise, so a seeded release is for tests and experiments, not for publication.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import typer

from ghofl.cli._options import AggregationOptions, ServerOptions, cli_plan
from ghofl.cli.io import check_output_file, privacy_report_path, write_json
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, InputError
from ghofl.model.manifest import file_sha256
from ghofl.server.fields import CLI, FIELDS
from ghofl.server.plan import FederationPlan, default_min_class_count
from ghofl.stats.codec import read_stats_header, save_stats

if TYPE_CHECKING:
    from ghofl.privacy import DPConfig
    from ghofl.server.run import Aggregated

__all__ = ["NOISE_SALT", "CentralRelease"]

#: Mixed with ``--seed`` into the noise generator's seed, as ``ghofl simulate`` does.
NOISE_SALT = 0x0D1FF


@dataclass(frozen=True)
class CentralRelease:
    """The central DP release ``ghofl aggregate`` was asked for, checked before any file is read.

    Attributes
    ----------
    dp : DPConfig
        ε, δ and the budget split (central mode).
    min_class_count : int
        k of the minimum-count rule, applied by the server to the noised counts.
    seed : int or None
        Seed of the noise (``--seed``); ``None``: OS entropy, not recorded.
    """

    dp: DPConfig
    min_class_count: int
    seed: int | None

    @classmethod
    def of(cls, aggregation: AggregationOptions, server: ServerOptions,
           min_class_count: int | None, store: Path | None) -> CentralRelease | None:
        """The release the options ask for (``None``: no ``--dp-epsilon``, the exact sum).

        Raises
        ------
        ConfigError
            A DP option is invalid (``--dp-delta`` without ``--dp-epsilon``, ...),
            ``--min-class-count`` is given without DP, DP is asked with ``--store``, or k < 1.
        """
        dp = aggregation.spec().dp
        eps, k_flag = CLI.name("aggregation.dp_epsilon"), CLI.name("client.min_class_count")
        if dp is None:
            if min_class_count is not None:
                raise ConfigError(
                    f"{k_flag} is the threshold a DP release applies to the noised counts; "
                    f"add {eps} EPS, or drop {k_flag} (without DP the total keeps every class "
                    "of the files)")
            return None
        if store is not None:
            store_flag = CLI.name("aggregation.store")
            raise ConfigError(
                f"{eps} cannot release the total of {store_flag}: the store keeps an exact "
                "running total over every call, and each noised release of it would spend the "
                "budget again with no accountant counting the releases; drop "
                f"{store_flag} to release the files' total once, or drop {eps}")
        dp.check_public_files()
        k = default_min_class_count(dp) if min_class_count is None else min_class_count
        cli_plan(lambda: ClientJob(("0",), min_class_count=k))  # k >= 1, its error by flag
        return cls(dp, k, given_seed(server))

    def check_files(self, files: Sequence[Path], out: Path) -> float:
        """The clipping bound R every file records; its privacy report's path checked too.

        Reads only the files' headers.

        Raises
        ------
        ConfigError
            A file records no clipping bound, files record different ones, or a file has a
            held-out section.
        InputError
            The report's path (:func:`~ghofl.cli.io.privacy_report_path`) is a directory or a
            payload.
        """
        clip = CLI.ask("client.clip_norm")
        bound: tuple[Path, float] | None = None
        for path in files:
            meta = read_stats_header(path).meta
            if meta.clip_norm is None:
                raise ConfigError(
                    f"file '{path}' has no clipping bound: recompute it with ghofl "
                    f"client-stats {clip}; DP needs every client's rows clipped to one public "
                    "bound, which the noise is calibrated to")
            if meta.has_holdout:
                raise ConfigError(
                    f"file '{path}' has a held-out section (holdout fraction "
                    f"{meta.holdout_fraction:g}): DP would count each held-out sample twice; "
                    f"recompute it with {CLI.setting('client.holdout_fraction', 0.0)}")
            if bound is not None and meta.clip_norm != bound[1]:
                raise ConfigError(
                    f"files '{bound[0]}' and '{path}' have different clipping bounds "
                    f"(R={bound[1]:g} and R={meta.clip_norm:g}); DP calibrates the noise to one "
                    f"public bound: recompute every payload with the same {clip}")
            bound = bound or (path, meta.clip_norm)
        report = privacy_report_path(out)
        check_output_file(report, "the privacy report")
        hit = next((p for p in files if report.exists() and os.path.samefile(p, report)), None)
        if hit is not None:
            raise InputError(f"the privacy report '{report}' (beside --out) is the payload "
                             f"'{hit}'; choose another --out path")
        assert bound is not None  # files is not empty (a typer argument)
        return bound[1]

    def plan(self, plan: FederationPlan) -> FederationPlan:
        """``plan`` (the payloads' plain plan) with this release's DP and minimum-count rule.

        Raises
        ------
        ConfigError
            A rule of the plan is broken.
        """
        client = replace(plan.client, min_class_count=self.min_class_count)
        aggregation = replace(plan.aggregation, dp=self.dp)
        return cli_plan(lambda: FederationPlan(client, aggregation, plan.server))

    def rng(self) -> np.random.Generator:
        """The noise's generator: seeded by :attr:`seed`, else from OS entropy."""
        if self.seed is None:
            return np.random.default_rng()
        return np.random.default_rng(np.random.SeedSequence([self.seed, NOISE_SALT]))

    def write(self, aggregated: Aggregated, out: Path, files: Sequence[Path],
              digests: Sequence[str]) -> None:
        """Write the release to ``out`` and its privacy report beside it; print both."""
        from ghofl import __version__

        total, privacy = aggregated.total, aggregated.privacy
        assert privacy is not None  # the plan has DP: the server released the total
        size = save_stats(total, out)
        report = privacy_report_path(out)
        write_json(report, {
            "privacy": privacy,
            "noise": {"source": "os-entropy" if self.seed is None else "seed",
                      "seed": self.seed},
            "files": [{"path": str(p), "sha256": d} for p, d in zip(files, digests, strict=True)],
            "out": str(out), "out_sha256": file_sha256(out), "ghofl_version": __version__},
            "the privacy report")
        typer.echo(f"released the total of {len(files)} files into {out} under differential "
                   f"privacy: n={total.n_samples} samples (noised), {total.num_classes} "
                   f"classes, mode {total.mode}, dim {total.dim} ({size} bytes)")
        echo_privacy(privacy, self.seed)
        typer.echo(f"privacy report: {report}")


def echo_privacy(privacy: dict[str, Any], seed: int | None) -> None:
    """Print the spent budget, σ per block, the noise's source and the post-processing."""
    sigma = ", ".join(f"{b}={v:.4g}" for b, v in privacy["sigma"].items())
    typer.echo(f"differential privacy (central): spent epsilon={privacy['epsilon_spent']:g}, "
               f"delta={privacy['delta_spent']:.3g}; noise multiplier "
               f"{privacy['noise_multiplier']:.4g}, sigma per block: {sigma}")
    typer.echo("  noise from OS entropy (not recorded)" if seed is None else
               f"  noise seeded by {CLI.name('server.seed')} {seed}: anyone who knows the "
               "seed can remove it; do not publish this release")
    for note in privacy["postprocessing"]:
        typer.echo(f"  post-processing: {note}")


def given_seed(server: ServerOptions) -> int | None:
    """``--seed`` when the command line gives it, else ``None`` (its default is the heads')."""
    name = FIELDS["server.seed"].name
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    if source is None or source in (click.core.ParameterSource.DEFAULT,
                                    click.core.ParameterSource.DEFAULT_MAP):
        return None
    seed = server[name]
    return None if seed is None else int(seed)
