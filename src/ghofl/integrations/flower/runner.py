"""Local Flower runs on 127.0.0.1: a private SuperLink, SuperNodes, ``flwr run``, stopped by PID.

:class:`LocalFlower` is a context manager that starts exactly the processes it needs and, on
exit, stops exactly those (each one, its descendants, and every process that inherited its
marker environment variable, even once re-parented), then checks that none survives:

* simulation: ``flower-superlink --insecure --simulation`` and ``flwr run APP ghofl --stream``
  with ``num_supernodes = N`` (Ray on loopback);
* deployment: ``flower-superlink --insecure`` and N × ``flower-supernode --insecure --superlink
  127.0.0.1:P --node-config "data-path=... partition-id=i num-partitions=N"``, each on its own
  port, then ``flwr run``.

The simulation engine gives its nodes no node config of their own: ``node_configs`` (the extra
node config of each simulated node, by partition id: identity key, roster, ledger, ...) is
written to ``simulated-nodes.json`` in the work folder and named by the environment variable
:data:`~ghofl.integrations.flower.SIM_NODE_CONFIG_ENV` of every process, which
ghofl's ClientApp reads.

Every process gets ``FLWR_TELEMETRY_ENABLED=0``, ``FLWR_DISABLE_UPDATE_CHECK=1``,
``RAY_USAGE_STATS_ENABLED=0``, a private ``FLWR_HOME`` and ``UV_CACHE_DIR``, and the SuperLink
never installs dependencies (``--disable-runtime-dependency-installation``): the apps run from
this virtualenv. :func:`run_local` is the one-call form used by ``ghofl flower-run``.

``flwr run --stream`` exits 0 even when the ServerApp raised, so the outcome is always read from
``results.json`` in the run's ``out-dir``.

A run may swap the app's ClientApp for another (``LocalFlower.run(..., client_app=FILE)``): the
app folder's files that a Flower app bundle holds are copied to ``app-<n>`` in the work folder,
with ``FILE`` beside them and the ``clientapp`` component of ``pyproject.toml`` naming its
``app`` (e.g. a test's ClientApp that wraps ghofl's); the ServerApp and the run config's
defaults stay the app folder's.

By default every process runs ``--insecure``. With ``tls`` (a
:class:`~ghofl.integrations.flower.tls.LoopbackCredentials`, e.g. from
:func:`~ghofl.integrations.flower.tls.make_loopback_credentials`) the SuperLink serves HTTPS
(``--ssl-ca-certfile --ssl-certfile --ssl-keyfile``), the SuperNodes verify it
(``--root-certificates``) and the ``flwr`` CLI's ``config.toml`` names the CA
(``root-certificates``). With ``supernode_auth`` as well the SuperLink runs
``--enable-supernode-auth``: only SuperNodes whose public key was registered
(:meth:`LocalFlower.register_supernode`, i.e. ``flwr supernode register KEY``) and that sign
with the private key (``--auth-supernode-private-key``) may connect.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from ghofl.errors import ConfigError, GhoflError, require_extra
from ghofl.integrations.flower import SIM_NODE_CONFIG_ENV

if TYPE_CHECKING:
    from ghofl.integrations.flower.tls import LoopbackCredentials

__all__ = [
    "FlowerRunError",
    "LocalFlower",
    "ProcessGroup",
    "app_with_client",
    "default_app_dir",
    "free_port",
    "identity_node_config",
    "make_identities",
    "run_local",
]

Engine = Literal["simulation", "deployment"]
MARKER_ENV = "GHOFL_FLOWER_RUN"
FEDERATION = "ghofl"


class FlowerRunError(GhoflError, RuntimeError):
    """A local Flower run produced no results.json (the logs' tails are in the message)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_app_dir() -> Path:
    """``examples/flower_app`` of the ghofl source tree (give ``app_dir`` otherwise)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "examples" / "flower_app"
        if (candidate / "pyproject.toml").is_file():
            return candidate
    raise ConfigError(
        "cannot find the Flower app folder examples/flower_app of the ghofl sources; give "
        "its path (--app DIR), a folder whose pyproject.toml names ghofl's ServerApp/ClientApp"
    )


# ---------------------------------------------------------------------- processes
def _parent_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(root: int) -> set[int]:
    """Every live descendant of process ``root`` (from /proc)."""
    children, out, todo = _parent_map(), set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def marked_pids(marker: str, variable: str = MARKER_ENV) -> set[int]:
    """Processes whose environment holds ``variable=marker``, from /proc.

    They inherit it, and keep it once re-parented.
    """
    needle = f"{variable}={marker}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ProcessGroup:
    """Processes started for one local run, all marked with one environment variable.

    Parameters
    ----------
    env : mapping of str to str
        Environment of every process (the marker is added).
    logdir : Path
        Each process logs to ``logdir/<name>.log``.

    Attributes
    ----------
    procs : dict of str to Popen
    seen : set of int
        Every PID this group started or found marked (for :meth:`survivors`).
    """

    def __init__(self, env: Mapping[str, str], logdir: Path) -> None:
        self.marker = uuid.uuid4().hex
        self.env = {**env, MARKER_ENV: self.marker}
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: set[int] = set()

    def start(self, name: str, cmd: Sequence[str], cwd: Path | None = None
              ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in the background, logging to ``<name>.log``."""
        if name in self.procs and self.procs[name].poll() is None:
            raise ConfigError(f"a process named {name!r} is already running")
        with (self.logdir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(list(cmd), env=self.env, cwd=cwd or self.logdir,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        self.seen.add(proc.pid)
        return proc

    def log(self, name: str) -> Path:
        """The log file of the process ``name``."""
        return self.logdir / f"{name}.log"

    def stop(self, name: str, grace_s: float = 10.0) -> None:
        """Stop one process and its descendants (SIGTERM, then SIGKILL), by PID."""
        proc = self.procs.get(name)
        if proc is not None:
            self._stop({proc.pid} | descendants(proc.pid), grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every process of the group, its descendants and every marked process."""
        pids = set()
        for proc in self.procs.values():
            pids |= {proc.pid} | descendants(proc.pid)
        pids |= marked_pids(self.marker)
        self._stop(pids, grace_s)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def survivors(self) -> list[int]:
        """PIDs started or marked by this group that are still alive (should be none)."""
        return sorted(p for p in self.seen | marked_pids(self.marker) if pid_alive(p)
                      and p != os.getpid())

    def _stop(self, pids: set[int], grace_s: float) -> None:
        pids.discard(os.getpid())
        self.seen |= pids
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for pid in sorted(pids):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                for proc in self.procs.values():
                    proc.poll()  # reap our direct children
                if not any(pid_alive(p) for p in pids):
                    return
                time.sleep(0.1)
            # processes started while we were stopping the others
            pids = {p for p in pids | marked_pids(self.marker) if pid_alive(p)} - {os.getpid()}
            self.seen |= pids


def flower_env(root: Path, python: str | None = None) -> dict[str, str]:
    """Environment of every Flower process: private state, no telemetry, loopback only.

    ``python`` is the interpreter whose ``bin/`` (with the ``flwr`` scripts) goes first on
    ``PATH`` (default: this one).
    """
    bindir = str(Path(python or sys.executable).parent)  # not resolved: keep the venv's bin/
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env.update(
        PATH=bindir + os.pathsep + env.get("PATH", ""),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_HOME=str(root / "flwr_home"),
        UV_CACHE_DIR=str(root / "uv_cache"),
        UV_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # Ray node IP 127.0.0.1, loopback sockets
        PYTHONUNBUFFERED="1",
    )
    # Flower's SuperExec looks for a new ServerApp/ClientApp task once a second by default; every
    # message of a multi-stage protocol waits for that look (a user's own value is kept).
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    return env


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def _tail(paths: Sequence[Path], chars: int = 4000) -> str:
    parts = []
    for path in paths:
        if path.exists():
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts)


# ---------------------------------------------------------------------- a local federation
class LocalFlower:
    """A private SuperLink (and SuperNodes) on 127.0.0.1, stopped by PID on exit.

    Parameters
    ----------
    workdir : Path
        Logs, the SuperLink database, the private ``FLWR_HOME`` and ``UV_CACHE_DIR``.
    engine : {"simulation", "deployment"}
    tls : LoopbackCredentials, optional
        CA certificate, SuperLink certificate and key: HTTPS instead of ``--insecure``.
    supernode_auth : bool
        ``--enable-supernode-auth`` (deployment, needs ``tls``): register each SuperNode's
        public key with :meth:`register_supernode` and start it with its private key.
    node_configs : sequence of mapping, optional
        Simulation: the extra node config of simulated node ``i`` (partition id ``i``), read by
        ghofl's ClientApp (see the module docstring). In deployment give each SuperNode its
        own with :meth:`add_supernode`.

    Attributes
    ----------
    port : int
        The SuperLink's port (kept across :meth:`restart_superlink`).
    nodes : dict of int to str
        Partition id → process name of each SuperNode started.
    timings : dict of str to float
        Seconds: ``superlink_start`` and one ``run:<n>`` per :meth:`run`.
    """

    def __init__(self, workdir: Path, engine: Engine = "simulation", *,
                 tls: LoopbackCredentials | None = None, supernode_auth: bool = False,
                 node_configs: Sequence[Mapping[str, object]] | None = None) -> None:
        require_extra("flwr", "flower")
        if engine not in ("simulation", "deployment"):
            raise ConfigError(f"engine must be 'simulation' or 'deployment'; got {engine!r}")
        if supernode_auth and (tls is None or engine != "deployment"):
            raise ConfigError(
                "supernode_auth needs the deployment engine and TLS certificates (Flower "
                "refuses SuperNode authentication over --insecure); give engine='deployment' "
                "and tls=make_loopback_credentials(...)")
        self.tls = tls
        self.supernode_auth = supernode_auth
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        # Ray's session folder holds Unix sockets (107-byte path limit): keep it short.
        self._ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))
        env = flower_env(self.workdir)
        env["RAY_TMPDIR"] = str(self._ray_tmp)
        env.pop(SIM_NODE_CONFIG_ENV, None)  # never a node config of another run
        if node_configs is not None:
            if engine != "simulation":
                raise ConfigError("node_configs are for the simulation engine; in deployment "
                                  "give each SuperNode its own (add_supernode(..., extra=...))")
            nodes_file = self.workdir / "simulated-nodes.json"
            nodes_file.write_text(json.dumps({str(i): dict(c) for i, c in
                                              enumerate(node_configs)}, indent=1, default=str))
            env[SIM_NODE_CONFIG_ENV] = str(nodes_file)
        self.group = ProcessGroup(env, self.workdir)
        self.port = free_port()
        self.nodes: dict[int, str] = {}
        self.timings: dict[str, float] = {}
        self._runs = 0
        self._cli_calls = 0
        Path(env["FLWR_HOME"]).mkdir(parents=True, exist_ok=True)
        channel = ("insecure = true" if tls is None else
                   f"root-certificates = {_toml(Path(tls.ca_cert).resolve())}")
        (Path(env["FLWR_HOME"]) / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
            f'address = "127.0.0.1:{self.port}"\n{channel}\n'
        )

    def __enter__(self) -> LocalFlower:
        try:
            self.start_superlink()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process started (by PID) and remove the Ray temp folder."""
        self.group.stop_all()
        shutil.rmtree(self._ray_tmp, ignore_errors=True)

    def survivors(self) -> list[int]:
        """PIDs started or marked by this run that are still alive (should be none)."""
        return self.group.survivors()

    # ------------------------------------------------------------------ processes
    def start_superlink(self, timeout_s: float = 90.0) -> None:
        """Start the SuperLink on :attr:`port` and wait until it is healthy."""
        t0 = time.perf_counter()
        cmd = ["flower-superlink", *self._superlink_channel(), "--host", "127.0.0.1", "--port",
               str(self.port), "--database", str(self.workdir / "superlink.db"),
               "--disable-runtime-dependency-installation"]
        if self.engine == "simulation":
            cmd += ["--simulation"]
        proc = self.group.start("superlink", [self._bin(cmd[0]), *cmd[1:]])
        scheme, context = "http", None
        if self.tls is not None:
            scheme, context = "https", ssl.create_default_context(cafile=str(self.tls.ca_cert))
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise FlowerRunError(
                    f"flower-superlink exited with code {proc.returncode}\n"
                    + _tail([self.group.log("superlink")]))
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health",
                                            timeout=2, context=context) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise FlowerRunError(
                    f"flower-superlink not healthy on 127.0.0.1:{self.port} after "
                    f"{timeout_s:g} s\n" + _tail([self.group.log("superlink")]))
            time.sleep(0.3)
        self.timings["superlink_start"] = time.perf_counter() - t0

    def _superlink_channel(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        out = ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile",
               str(self.tls.server_cert), "--ssl-keyfile", str(self.tls.server_key)]
        return out + (["--enable-supernode-auth"] if self.supernode_auth else [])

    def stop_superlink(self) -> None:
        """Stop the SuperLink process and its descendants."""
        self.group.stop("superlink")

    def restart_superlink(self) -> None:
        """Stop the SuperLink and start it again on the same port and database."""
        self.stop_superlink()
        self.start_superlink()

    def add_supernode(self, partition_id: int, num_partitions: int,
                      data_path: str | os.PathLike[str] | None = None,
                      extra: Mapping[str, object] | None = None, *,
                      auth_key: Path | None = None,
                      root_certificates: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a SuperNode (deployment) for ``partition_id`` with its own port.

        With TLS it verifies the SuperLink against ``root_certificates`` (default: the CA of
        ``tls``); ``auth_key`` is its OpenSSH private key (``--auth-supernode-private-key``).
        """
        if self.engine != "deployment":
            raise ConfigError("SuperNodes are started only by the deployment engine")
        items = {"partition-id": partition_id, "num-partitions": num_partitions}
        if data_path is not None:
            items["data-path"] = str(Path(data_path).resolve())  # type: ignore[assignment]
        items.update(dict(extra or {}))  # type: ignore[arg-type]
        node_config = " ".join(f"{k}={_toml(v)}" for k, v in items.items())
        name = f"supernode-{partition_id}"
        if self.tls is None and (auth_key is not None or root_certificates is not None):
            raise ConfigError("auth_key and root_certificates need a TLS federation: give "
                              "LocalFlower(..., tls=make_loopback_credentials(...))")
        channel = ["--insecure"] if self.tls is None else [
            "--root-certificates", str(Path(root_certificates or self.tls.ca_cert).resolve())]
        if auth_key is not None:
            channel += ["--auth-supernode-private-key", str(Path(auth_key).resolve())]
        proc = self.group.start(name, [
            self._bin("flower-supernode"), *channel, "--superlink",
            f"127.0.0.1:{self.port}", "--host", "127.0.0.1", "--port", str(free_port()),
            "--node-config", node_config,
        ])
        self.nodes[partition_id] = name
        return proc

    def register_supernode(self, public_key: Path, timeout_s: float = 120.0) -> int:
        """Register a SuperNode's OpenSSH public key; return the node id it was given.

        Runs ``flwr supernode register KEY`` against the SuperLink.
        """
        out = self._flwr_json("register", ["supernode", "register",
                                           str(Path(public_key).resolve()), FEDERATION],
                              timeout_s)
        if not out.get("success") or "node-id" not in out:
            raise FlowerRunError(f"flwr supernode register {public_key} failed: {out}")
        return int(out["node-id"])

    def list_supernodes(self, timeout_s: float = 120.0) -> dict[int, str]:
        """Node id → status of every SuperNode the SuperLink knows (``flwr supernode list``).

        Statuses are ``registered``, ``online``, ...
        """
        out = self._flwr_json("list", ["supernode", "list", FEDERATION], timeout_s)
        return {int(n["node-id"]): str(n["status"]) for n in out.get("nodes", [])}

    def _flwr_json(self, what: str, args: Sequence[str], timeout_s: float) -> dict[str, Any]:
        self._cli_calls += 1
        name = f"flwr-{what}-{self._cli_calls}"
        proc = self.group.start(name, [self._bin("flwr"), *args, "--format", "json"])
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.group.stop(name)
            raise FlowerRunError(f"flwr {' '.join(args)} timed out after {timeout_s:g} s\n"
                                 + _tail([self.group.log(name)])) from None
        text = self.group.log(name).read_text(errors="replace")
        try:
            out: dict[str, Any] = json.loads(text[text.index("{"):text.rindex("}") + 1])
        except ValueError:
            raise FlowerRunError(f"flwr {' '.join(args)} (exit code {proc.returncode}) "
                                 f"printed no JSON\n" + _tail([self.group.log(name)])) from None
        return out

    def _bin(self, name: str) -> str:
        path = Path(sys.executable).parent / name
        return str(path) if path.exists() else name

    # ------------------------------------------------------------------ runs
    def run(self, run_config: Mapping[str, Any], *, app_dir: Path | None = None,
            num_supernodes: int | None = None, timeout_s: float = 600.0,
            client_app: Path | None = None) -> dict[str, Any]:
        """``flwr run APP ghofl --stream`` with ``run_config``; return the parsed results.

        ``run_config`` must hold ``out-dir``. The result is ``results.json`` plus ``wall_s``
        (submission to exit of ``flwr run``). With ``client_app`` (a Python file whose ``app``
        is a ``flwr.clientapp.ClientApp``) the run submits a copy of the app folder whose
        ClientApp is that one (:func:`app_with_client`).

        Raises
        ------
        ConfigError
            ``client_app`` is not a Python file, or the app's ``pyproject.toml`` names no
            ClientApp component.
        FlowerRunError
            ``flwr run`` timed out or no ``results.json`` was written.
        """
        if "out-dir" not in run_config:
            raise ConfigError("the run config needs 'out-dir' (where results.json is written)")
        out_dir = Path(str(run_config["out-dir"])).resolve()
        results = out_dir / "results.json"
        results.unlink(missing_ok=True)
        self._runs += 1
        n = self._runs
        cfg_file = self.workdir / f"run-{n}.toml"
        cfg_file.write_text("".join(f"{json.dumps(str(k))} = {_toml(v)}\n"
                                    for k, v in {**run_config, "out-dir": str(out_dir)}.items()))
        app = Path(app_dir or default_app_dir()).resolve()
        if client_app is not None:
            app = app_with_client(app, Path(client_app), self.workdir / f"app-{n}")
        cmd = [self._bin("flwr"), "run", str(app), FEDERATION, "--stream", "--run-config",
               str(cfg_file)]
        if self.engine == "simulation":
            nodes = int(num_supernodes or 2)
            cmd += ["--federation-config",
                    f"num_supernodes={nodes} client_resources_num_cpus=1 "
                    f"init_args_num_cpus={os.cpu_count() or 1} init_args_log_to_driver=false"]
        name = f"flwr-run-{n}"
        t0 = time.perf_counter()
        proc = self.group.start(name, cmd)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.group.stop(name)
            raise FlowerRunError(
                f"flwr run timed out after {timeout_s:g} s\n"
                + _tail([self.group.log("superlink"), self.group.log(name)])) from None
        wall = time.perf_counter() - t0
        self.timings[f"run:{n}"] = wall
        if not results.exists():
            raise FlowerRunError(
                f"flwr run (exit code {proc.returncode}) wrote no {results}\n"
                + _tail([self.group.log("superlink"), self.group.log(name)]))
        out: dict[str, Any] = json.loads(results.read_text())
        out["wall_s"] = wall
        return out


#: Suffixes of the files a Flower app bundle (FAB) holds, as ``flwr build`` includes them.
_FAB_SUFFIXES = (".py", ".toml", ".md", ".yaml", ".yml", ".json", ".jsonl")
_CLIENTAPP_LINE = re.compile(r"^(\s*clientapp\s*=\s*).*$", re.MULTILINE)


def app_with_client(app_dir: Path, client_app: Path, dest: Path) -> Path:
    """A copy of the Flower app ``app_dir`` in ``dest`` whose ClientApp is ``client_app``'s.

    ``dest`` is emptied first; it receives the app's bundle files (the suffixes of
    :data:`_FAB_SUFFIXES`, outside hidden folders and ``__pycache__``) and the Python file
    ``client_app``, and its ``pyproject.toml`` names ``<module>:app`` as the ``clientapp``
    component (``<module>``: the file's name without ``.py``). Returns ``dest``.

    Raises
    ------
    ConfigError
        ``client_app`` is not a Python file, or ``app_dir/pyproject.toml`` has no
        ``[tool.flwr.app.components]`` ``clientapp``.
    """
    app_dir, client_app = Path(app_dir), Path(client_app)
    if client_app.suffix != ".py" or not client_app.is_file():
        raise ConfigError(f"client_app must be a Python file whose 'app' is the ClientApp; "
                          f"got {client_app}")
    text = (app_dir / "pyproject.toml").read_text()
    components = tomllib.loads(text).get("tool", {}).get("flwr", {}).get("app", {}).get(
        "components", {})
    if "clientapp" not in components or len(_CLIENTAPP_LINE.findall(text)) != 1:
        raise ConfigError(f"{app_dir / 'pyproject.toml'} names no ClientApp (one line "
                          "'clientapp = ...' under [tool.flwr.app.components]); give the "
                          "folder of a Flower app")
    shutil.rmtree(dest, ignore_errors=True)
    for path in sorted(app_dir.rglob("*")):
        rel = path.relative_to(app_dir)
        hidden = any(part.startswith(".") or part == "__pycache__" for part in rel.parts)
        if path.is_file() and path.suffix in _FAB_SUFFIXES and not hidden:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)
    shutil.copyfile(client_app, dest / client_app.name)
    (dest / "pyproject.toml").write_text(_CLIENTAPP_LINE.sub(
        lambda m: f"{m.group(1)}{json.dumps(f'{client_app.stem}:app')}", text))
    return dest


def make_identities(folder: Path, nodes: int) -> Path:
    """Fresh identity keys ``site-<i>.key`` for ``nodes`` local nodes and their roster.

    For local runs, whose nodes are all the user's (``ghofl flower-run --secure``, tests):
    ``folder`` is emptied first (it belongs to the run). Returns the folder, which then holds
    ``roster.json`` and the keys, as ``ghofl flower-run --identities`` takes it; node ``i``
    gets the node config :func:`identity_node_config` ``(folder, i)``.
    """
    from ghofl.secure.identity import IdentityKey, Roster

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    keys = {f"site-{i}": IdentityKey.generate() for i in range(nodes)}
    for name, key in keys.items():
        key.save(folder / f"{name}.key", name)
    Roster.from_identities(keys).save(folder / "roster.json")
    return folder


def identity_node_config(folder: Path, i: int) -> dict[str, str]:
    """Node config keys ``identity-key`` and ``roster`` of node ``i`` of :func:`make_identities`."""
    folder = Path(folder).resolve()
    return {"identity-key": str(folder / f"site-{i}.key"), "roster": str(folder / "roster.json")}


@contextlib.contextmanager
def _local(workdir: Path, engine: Engine,
           node_configs: Sequence[Mapping[str, object]] | None) -> Iterator[LocalFlower]:
    with LocalFlower(workdir, engine, node_configs=node_configs) as flower:
        yield flower


def run_local(engine: Engine, nodes: int, run_config: Mapping[str, Any], workdir: Path, *,
              data_template: str | None = None, app_dir: Path | None = None,
              timeout_s: float = 900.0,
              node_extra: Sequence[Mapping[str, object]] | None = None) -> dict[str, Any]:
    """One whole local run: start, ``flwr run``, stop everything; return ``results.json``.

    In deployment each SuperNode ``i`` gets ``data-path = data_template.format(partition_id=i)``
    and, when given, the node config keys ``node_extra[i]`` (e.g. its identity key); on the
    simulation engine simulated node ``i`` gets ``node_extra[i]`` through
    :data:`~ghofl.integrations.flower.SIM_NODE_CONFIG_ENV` (``LocalFlower(node_configs=...)``).
    Raises :class:`FlowerRunError` when a process survives the shutdown.
    """
    cfg = {**run_config, "expected-nodes": nodes}
    if data_template is not None:
        cfg["data-template"] = str(Path(data_template).resolve()) if "{" not in str(
            Path(data_template).parent) else data_template
    sim_nodes = node_extra if engine == "simulation" else None
    with _local(workdir, engine, sim_nodes) as flower:
        if engine == "deployment":
            template = str(cfg.get("data-template", ""))
            for i in range(nodes):
                flower.add_supernode(i, nodes, template.format(partition_id=i) if template
                                     else None, extra=node_extra[i] if node_extra else None)
        result = flower.run(cfg, app_dir=app_dir, num_supernodes=nodes, timeout_s=timeout_s)
        result["superlink_start_s"] = flower.timings.get("superlink_start")
    left = flower.survivors()
    if left:
        raise FlowerRunError(f"processes of the Flower run survived the shutdown: {left}")
    return result
