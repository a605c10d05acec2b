"""Flower's built-in SecAgg+ as a baseline for ghofl's exact secure aggregation.

:func:`flower_secaggplus_sum` sums one float64 vector per client with Flower 1.42's SecAgg+
(``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on the clients, legacy strategy API)
in the Flower simulation engine, driven by ``flwr run`` on the hand-written app in
``benchmarks/flower_secaggplus_app/``. This module imports neither flwr nor ray: everything
Flower runs in subprocesses of a separate virtualenv (``python=``), for example::

    pip install 'ghofl[flower]'   # flwr[simulation]==1.42.0

(``make bench-secure`` uses the project's ``.venv``, which ``make test`` sets up with it).

How a run goes (all on 127.0.0.1, every process stopped by PID afterwards):

1. The vectors are stacked into ``workdir/data.npy``; client ``i`` of the simulation
   memory-maps row ``i`` (``node_config["partition-id"]``) and returns it from ``fit`` with
   ``num_examples`` equal for all clients.
2. A private SuperLink (``flower-superlink --simulation``) starts on a free loopback port with
   runtime dependency installation disabled (no ``uv sync``) and a private ``FLWR_HOME``.
   ``flwr run APP bench --stream`` submits the app with ``num_supernodes = len(vectors)``.
   Ray gets node IP 127.0.0.1 and binds only loopback through
   ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: flwr 1.42's federation config has no field for
   ray's ``_node_ip_address``, and with that variable Ray's node IP resolves to 127.0.0.1
   (checked with ``ss -ltnp``: every Ray socket listens on 127.0.0.1).
3. Each client quantises ``w/W * x`` (``w`` = num_examples, ``W`` = max_weight) clipped to
   ``[-c, c]`` to integers in ``[0, T]`` by stochastic rounding, adds masks mod ``M`` and sends
   it; the server unmasks, de-quantises and divides by the total weight. The ServerApp writes
   that mean unchanged (``result.npy``) and ``result.json`` (success marker, SecAgg+ stage
   time). The sum is the mean times the number of clients.

Precision. With ``w = W`` (the default here) a client's value is quantised with step ``2c/T``;
stochastic rounding makes each client's error at most one step, so the summed error is about
``sqrt(n) * 2c / T`` at worst-case entries, i.e. a relative error (to max|sum|) of the order
``2 / (T * sqrt(n))`` when ``c = max|x|``. A smaller ``w/W`` shrinks the effective range
(``round(w/W * T)`` levels) and clips at ``c * W / w``.

Flower pitfalls met (flwr 1.42):

* ``quantize`` casts ``ceil(...)`` to int32: any ``quantization_range`` above ``2**31 - 2``
  overflows (``2**31 - 1`` already wraps the entry equal to ``+clipping_range`` to
  ``-2**31`` for about 15% of clipping values, by float rounding of ``(2c) * (T / (2c))``).
  Flower's own checks accept any ``T < M`` and give no error.
* The masks are int64 (``RandomState.randint``) and sums are reduced with ``& (M - 1)``, so
  ``modulus_range`` may go up to ``2**62`` (the largest power of two that the int64
  ConfigRecord carries), despite the docstring's "must be less than 4294967296". It must exceed
  ``n * T`` or the sum (and the packed total weight) wraps silently; Flower only warns when
  ``num_shares > M / T``.
* Clipping is silent: values beyond ``c`` are clipped with no report, hence
  ``clipped_fraction`` (computed here from the inputs).
* ``SecAggPlusWorkflow`` only logs "Secure aggregation halted." when it falls below its
  threshold; the ServerApp here raises instead, and ``flwr run --stream`` exits 0 either way,
  so success is read from ``result.json``.
* Masks come from 32-bit seeds (the XOR of the key's 4-byte words) in numpy's Mersenne
  Twister; a client that drops before the masking stage makes every survivor fail (KeyError)
  (reported for flwr 1.42). No dropouts are simulated here.

Run ``python benchmarks/flower_secaggplus.py`` (any Python with numpy; ``--python`` names the
Flower venv's interpreter) for the smoke run described in :func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.integrations.flower.runner import (
    descendants,
    flower_env,
    free_port,
    marked_pids,
    pid_alive,
)

APP_DIR = Path(__file__).resolve().parent / "flower_secaggplus_app"
DEFAULT_PYTHON = os.environ.get("GHOFL_FLOWER_PYTHON", sys.executable)

#: Flower's defaults: the keyword defaults of ``SecAggPlusWorkflow.__init__`` in flwr 1.42
#: (``max_weight``, ``clipping_range``, ``quantization_range``, ``modulus_range``, ``timeout``);
#: ``num_shares``/``reconstruction_threshold`` have no default there and are taken from
#: Flower's ``examples/flower-secure-aggregation`` (3 and 2). ``num_examples`` (the clients'
#: ``FitRes.num_examples``, equal for all) is set to ``max_weight`` so that the weighting
#: factor is exactly 1 and the full quantisation range is used. Callers usually replace
#: ``clipping_range`` (8.0) by ``max |value|`` of their data (:func:`with_clipping_range`).
FLOWER_DEFAULTS: dict[str, Any] = {
    "num_shares": 3,
    "reconstruction_threshold": 2,
    "max_weight": 1000.0,
    "num_examples": 1000,
    "clipping_range": 8.0,
    "quantization_range": 2**22,
    "modulus_range": 2**32,
    "timeout": None,
}

#: The most precise settings that still work in flwr 1.42: ``quantization_range = 2**31 - 2``,
#: the largest ``T`` whose quantised values fit the int32 cast in ``flwr``'s ``quantize`` (no
#: overflow for 20,000 random clipping ranges; ``2**31 - 1`` overflowed at ``x = +c`` for ~15%
#: of them, since ``(2c) * (T / (2c))`` can round above ``T``); and
#: ``modulus_range = 2**62``, the largest power of two that fits the int64 config values (the
#: masks are int64), far above ``n * T`` for any feasible ``n``. Weights: ``num_examples =
#: max_weight = 1`` (factor 1). ``clipping_range`` must cover the data: the caller sets it to
#: ``max |value|`` (:func:`with_clipping_range`); it has no data-independent best value.
FLOWER_MOST_PRECISE: dict[str, Any] = {
    "num_shares": 3,
    "reconstruction_threshold": 2,
    "max_weight": 1.0,
    "num_examples": 1,
    "clipping_range": 8.0,
    "quantization_range": 2**31 - 2,
    "modulus_range": 2**62,
    "timeout": None,
}

#: Ray resources of the simulation: one CPU per virtual client, all CPUs of the machine.
CLIENT_NUM_CPUS = 1

_SETTING_KEYS = frozenset(FLOWER_DEFAULTS)
_MARKER_ENV = "GHOFL_FLWR_SECAGGPLUS_RUN"


def with_clipping_range(
    settings: Mapping[str, Any], vectors: Sequence[np.ndarray]
) -> dict[str, Any]:
    """``settings`` with ``clipping_range`` set to the largest ``|value|`` of all vectors."""
    peak = max(float(np.max(np.abs(v))) for v in vectors)
    return {**settings, "clipping_range": peak if peak > 0 else 1.0}


def resolve_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Flower's defaults overridden by ``settings``; checks what Flower checks and more.

    ``num_examples`` defaults to ``max_weight`` (rounded) when ``settings`` sets ``max_weight``
    without it.
    """
    unknown = set(settings) - _SETTING_KEYS
    if unknown:
        raise ValueError(f"unknown SecAgg+ settings: {sorted(unknown)}")
    out = {**FLOWER_DEFAULTS, **settings}
    if "max_weight" in settings and "num_examples" not in settings:
        out["num_examples"] = max(1, round(float(settings["max_weight"])))
    t, m = int(out["quantization_range"]), int(out["modulus_range"])
    if not 0 < t <= 2**31 - 2:
        raise ValueError("quantization_range must be in [1, 2**31 - 2] (flwr casts to int32)")
    if m <= t or m & (m - 1) or m > 2**62:
        raise ValueError("modulus_range must be a power of two in (quantization_range, 2**62]")
    if float(out["clipping_range"]) <= 0 or float(out["max_weight"]) <= 0:
        raise ValueError("clipping_range and max_weight must be positive")
    shares, threshold = out["num_shares"], out["reconstruction_threshold"]
    # Flower's own checks (an int 1 means the fraction 1.0), done here before Ray starts.
    if isinstance(shares, int) and shares != 1 and shares <= 2:
        raise ValueError("num_shares as an integer must be greater than 2")
    if isinstance(shares, int) and isinstance(threshold, int) and 1 != threshold >= shares:
        raise ValueError("reconstruction_threshold must be less than num_shares")
    if int(out["num_examples"]) < 1:
        raise ValueError("num_examples must be a positive integer")
    return out


def _client_factor(settings: Mapping[str, Any]) -> tuple[int, float]:
    """``(q_ratio, dq_ratio)``: the integer weight and float multiplier one client applies."""
    t = int(settings["quantization_range"])
    q_ratio = round(int(settings["num_examples"]) / float(settings["max_weight"]) * t)
    return q_ratio, q_ratio / t


def clipped_fraction(vectors: Sequence[np.ndarray], settings: Mapping[str, Any]) -> float:
    """Fraction of all client entries that SecAgg+ clips (``|dq_ratio * x| > clipping_range``)."""
    _, dq = _client_factor(settings)
    c = float(settings["clipping_range"])
    clipped = sum(int(np.count_nonzero(np.abs(v * dq) > c)) for v in vectors)
    return clipped / sum(v.size for v in vectors)


def _toml_value(value: Any) -> str:
    """One ``--run-config`` value (TOML: ints stay ints, floats keep a decimal point)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not SecAgg+ settings")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "-1.0"
    return "'" + str(value) + "'"


def _flower_env(python: str, home: Path, marker: str, ray_tmp: Path) -> dict[str, str]:
    """The runner's Flower environment for ``python``'s venv, plus this run's marker and Ray
    folder; no PYTHONPATH, so the Flower venv's own packages are used."""
    env = flower_env(home, python)
    env.pop("PYTHONPATH", None)
    env.update(VIRTUAL_ENV=str(Path(python).parent.parent), RAY_TMPDIR=str(ray_tmp),
               PYTHONDONTWRITEBYTECODE="1")
    env[_MARKER_ENV] = marker
    return env


def _marked_pids(marker: str) -> set[int]:
    """Processes of this run: they inherit ``_MARKER_ENV=marker`` (also once re-parented)."""
    return marked_pids(marker, _MARKER_ENV)


def _stop_processes(root: subprocess.Popen[bytes], marker: str, grace_s: float = 15.0) -> None:
    """Stop ``root``, its descendants and every process marked with this run, by PID."""
    pids = {root.pid} | descendants(root.pid) | _marked_pids(marker)
    pids.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in sorted(pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if root.poll() is None or any(pid_alive(p) for p in pids if p != root.pid):
                time.sleep(0.2)
                continue
            break
        # Catch processes started while we were stopping the others.
        pids = {p for p in pids | _marked_pids(marker) if pid_alive(p)} - {os.getpid()}
        if not pids and root.poll() is not None:
            return
    root.wait(timeout=5)


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink not healthy on 127.0.0.1:{port} after {timeout_s}s")


def _tail(paths: Sequence[Path], chars: int = 6000) -> str:
    parts = []
    for path in paths:
        if path.exists():
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name} ---\n{text[-chars:]}")
    return "\n".join(parts)


@contextlib.contextmanager
def _superlink(python: str, env: dict[str, str], workdir: Path) -> Iterator[int]:
    """A private simulation SuperLink on a free loopback port; stopped (by PID) on exit."""
    port = free_port()
    log = workdir / "superlink.log"
    cmd = [
        str(Path(python).parent / "flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_healthy(port, proc, timeout_s=90)
        yield port
    finally:
        _stop_processes(proc, env[_MARKER_ENV])


def flower_secaggplus_sum(
    vectors: Sequence[np.ndarray],
    *,
    python: str,
    settings: Mapping[str, Any],
    workdir: Path,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """Sum ``vectors`` (one per client) with Flower 1.42's SecAgg+ in the simulation engine.

    Args:
        vectors: one 1-D float64 array per virtual client, all of the same length (at least 2
            clients; Flower's SecAgg+ needs more clients than ``reconstruction_threshold``).
        python: interpreter of a virtualenv with ``flwr[simulation]==1.42.0`` and numpy; its
            ``bin/`` folder must hold ``flwr`` and ``flower-superlink``.
        settings: SecAgg+ knobs (keys of :data:`FLOWER_DEFAULTS`; missing keys take Flower's
            defaults): ``num_shares``, ``reconstruction_threshold``, ``max_weight``,
            ``num_examples``, ``clipping_range``, ``quantization_range``, ``modulus_range``,
            ``timeout`` (seconds per stage or None).
        workdir: folder for the data file, the private FLWR_HOME and the logs (created).
        timeout_s: limit for the whole ``flwr run``.

    Returns:
        ``sum`` (float64, the workflow's de-quantised mean times the number of clients),
        ``wall_s`` (the ``flwr run`` submission to the end of the run, Ray start included),
        ``superlink_start_s``, ``aggregate_s`` (the four SecAgg+ stages, measured in the
        ServerApp), ``flwr_version``, ``settings`` (as used), ``clipped_fraction`` (of all
        client entries) and ``num_clients``.

    Raises:
        RuntimeError: with the tail of the Flower logs when the run produced no result.
    """
    vecs = [np.asarray(v, dtype=np.float64) for v in vectors]
    if len(vecs) < 2:
        raise ValueError("SecAgg+ needs at least 2 clients")
    if any(v.ndim != 1 or v.shape != vecs[0].shape for v in vecs):
        raise ValueError("vectors must be 1-D and all of the same length")
    if not all(np.isfinite(v).all() for v in vecs):
        raise ValueError("vectors must be finite")
    used = resolve_settings(settings)
    n = len(vecs)
    q_ratio, _ = _client_factor(used)
    if n * max(int(used["quantization_range"]), q_ratio) >= int(used["modulus_range"]):
        raise ValueError(
            f"n * quantization_range = {n * int(used['quantization_range'])} must stay below "
            f"modulus_range = {used['modulus_range']} (else SecAgg+ wraps around silently)"
        )

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out_dir = workdir / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    data_path = workdir / "data.npy"
    np.save(data_path, np.stack(vecs))
    marker = uuid.uuid4().hex
    # Ray's session folder holds Unix sockets (107-byte path limit): keep it short.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))
    env = _flower_env(python, workdir, marker, ray_tmp)
    flwr_home = Path(env["FLWR_HOME"])
    flwr_home.mkdir(parents=True, exist_ok=True)
    run_log = workdir / "flwr_run.log"

    run_config = {
        "data-path": str(data_path),
        "out-dir": str(out_dir),
        "num-clients": n,
        "num-examples": int(used["num_examples"]),
        "num-shares": used["num_shares"],
        "reconstruction-threshold": used["reconstruction_threshold"],
        "max-weight": float(used["max_weight"]),
        "clipping-range": float(used["clipping_range"]),
        "quantization-range": int(used["quantization_range"]),
        "modulus-range": int(used["modulus_range"]),
        "timeout": -1.0 if used["timeout"] is None else float(used["timeout"]),
    }
    federation_config = (
        f"num_supernodes={n} client_resources_num_cpus={CLIENT_NUM_CPUS} "
        f"init_args_num_cpus={os.cpu_count() or 1} init_args_log_to_driver=false"
    )
    try:
        version = subprocess.run(
            [python, "-c", "import flwr; print(flwr.__version__)"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        t_link = time.perf_counter()
        with _superlink(python, env, workdir) as port:
            superlink_start_s = time.perf_counter() - t_link
            (flwr_home / "config.toml").write_text(
                '[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
                f'address = "127.0.0.1:{port}"\ninsecure = true\n'
            )
            cmd = [str(Path(python).parent / "flwr"), "run", str(APP_DIR), "bench", "--stream"]
            for key, value in run_config.items():
                cmd += ["--run-config", f"{key}={_toml_value(value)}"]
            cmd += ["--federation-config", federation_config]
            t_run = time.perf_counter()
            with run_log.open("wb") as out:
                flwr = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=workdir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
                try:
                    flwr.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    _stop_processes(flwr, marker)
                    raise RuntimeError(
                        f"flwr run timed out after {timeout_s}s\n"
                        + _tail([workdir / "superlink.log", run_log])
                    ) from None
            wall_s = time.perf_counter() - t_run
        result_json = out_dir / "result.json"
        if not result_json.exists():
            raise RuntimeError(
                f"flwr run (exit code {flwr.returncode}) wrote no result\n"
                + _tail([workdir / "superlink.log", run_log])
            )
        meta = json.loads(result_json.read_text())
        mean = np.load(out_dir / "result.npy")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        data_path.unlink(missing_ok=True)
    if mean.shape != vecs[0].shape:
        raise RuntimeError(f"Flower returned shape {mean.shape}, expected {vecs[0].shape}")
    return {
        "sum": mean * int(meta["num_results"]),
        "wall_s": wall_s,
        "superlink_start_s": superlink_start_s,
        "aggregate_s": meta.get("aggregate_s"),
        "flwr_version": version,
        "settings": used,
        "clipped_fraction": clipped_fraction(vecs, used),
        "num_clients": int(meta["num_results"]),
    }


def synthetic_pooled_vectors(
    n_clients: int, c: int = 10, d: int = 512, seed: int = 0
) -> list[np.ndarray]:
    """Vectors shaped like flattened pooled statistics: ``C*d`` per-class sums, ``C*d``
    per-class sums of squares and the ``d(d+1)/2`` upper triangle of a ``d x d`` scatter
    matrix (141,568 entries for C=10, d=512), with magnitudes up to ~1e4-1e5."""
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(d)
    out = []
    for _ in range(n_clients):
        counts = rng.integers(200, 1200, size=c).astype(np.float64)
        means = rng.normal(0.0, 1.0, size=(c, d))
        sums = counts[:, None] * means * 3.0
        squares = counts[:, None] * (means**2 + rng.uniform(0.5, 5.0, size=(c, d)))
        feats = rng.normal(0.0, 1.0, size=(64, d))
        scatter = feats.T @ feats * (counts.sum() / 64.0) * 0.5
        out.append(np.concatenate([sums.ravel(), squares.ravel(), scatter[iu]]))
    return out


def relative_error(flower_sum: np.ndarray, vectors: Sequence[np.ndarray]) -> float:
    """``max |flower_sum - exact| / max |exact|`` with the float64 sum as ``exact``."""
    exact = np.sum(np.stack(vectors), axis=0)
    return float(np.max(np.abs(flower_sum - exact)) / np.max(np.abs(exact)))


def main() -> None:
    """Smoke run: 10 clients with both presets, then 100 clients with Flower's defaults."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="the Flower venv's python")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="flower-secaggplus-"))
    presets = {"defaults": FLOWER_DEFAULTS, "most_precise": FLOWER_MOST_PRECISE}
    for n in args.clients:
        vectors = synthetic_pooled_vectors(n, seed=n)
        peak = max(float(np.max(np.abs(v))) for v in vectors)
        print(f"{n} clients, dim {vectors[0].size}, max |value| {peak:.4g}", flush=True)
        for name, preset in presets.items():
            if n > 10 and name != "defaults":
                continue
            res = flower_secaggplus_sum(
                vectors,
                python=args.python,
                settings=with_clipping_range(preset, vectors),
                workdir=root / f"{name}-{n}",
            )
            agg = res["aggregate_s"]
            print(
                f"  {name:12s} rel_err {relative_error(res['sum'], vectors):.3e}  "
                f"wall {res['wall_s']:.1f}s  secagg {agg:.1f}s  "
                f"superlink {res['superlink_start_s']:.1f}s  "
                f"clipped {res['clipped_fraction']:.2g}  flwr {res['flwr_version']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
