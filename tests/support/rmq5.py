"""The official RocketMQ 5.x Python client (rocketmq-python-client), in a venv of its own.

Why a venv and a subprocess: the client hard-depends on protobuf >= 6.33 and
OpenTelemetry, imports as `rocketmq` (the name of the Apache C++ wheel our interop tier
uses) and registers the `apache.rocketmq.v2` protobuf symbols in protobuf's default pool.
It is created once per machine and version in ~/.cache/pocketmq/rmq5-venv-<version>
(POCKETMQ_RMQ5_VENV overrides the path), guarded by a lock file (parallel runs wait, never
build twice) and marked complete only once `import rocketmq.v5` works. Tests that need it
are skipped, with pip's own words as the reason, when it cannot be made (no network).

`proxy_cluster(root)` makes a nameserver + broker pair serving the gRPC endpoint.
`run_driver(python, endpoint, scenario, **args)` runs tests/support/rmq5_driver.py with that
venv's Python and returns the JSON events it printed.
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import subprocess
import sys

import pytest

RMQ5_VERSION = "5.1.2"
DRIVER = pathlib.Path(__file__).with_name("rmq5_driver.py")


def cache_dir(env_var: str, name: str) -> pathlib.Path:
    """~/.cache/pocketmq/<name>, or what $env_var says."""
    override = os.environ.get(env_var)
    if override:
        return pathlib.Path(override)
    return pathlib.Path.home() / ".cache" / "pocketmq" / name


def venv_dir() -> pathlib.Path:
    return cache_dir("POCKETMQ_RMQ5_VENV", f"rmq5-venv-{RMQ5_VERSION}")


def proxy_cluster(root: str, broker_args: tuple[str, ...] = ()):
    """A Cluster (tests/support/daemons.py, not started) whose broker serves the gRPC endpoint
    on a free port; `.grpc_endpoint` is its host:port."""
    from tests.support.daemons import Cluster, free_port
    grpc_port = free_port()
    c = Cluster(root, broker_args=["--enable-proxy", f"--grpcServerPort={grpc_port}", *broker_args])
    c.grpc_endpoint = f"127.0.0.1:{grpc_port}"
    return c


class Unavailable(Exception):
    """The client's venv cannot be made here; the message says why."""


def _python(d: pathlib.Path) -> pathlib.Path:
    return d / "bin" / "python"


def build_once(d: pathlib.Path, steps: list[list[str]], version: str, timeout_s: float = 600) -> None:
    """Run `steps` to build the cache dir `d` unless it is marked ready: once per machine
    (a lock file makes parallel runs wait, never build twice), from scratch (a half-built
    dir of an interrupted run is removed first), marked ready only when every step passed.
    Raises Unavailable with the failing step's last words."""
    ready = d / ".pocketmq-ready"
    if ready.exists():
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(str(d) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # another run may be building it: wait for that one
        if ready.exists():
            return
        if d.exists():
            import shutil
            shutil.rmtree(d)                 # a half-built dir from an interrupted run
        for cmd in steps:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise Unavailable(f"{' '.join(cmd[:4])}...: {e}") from None
            if p.returncode != 0:
                tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
                raise Unavailable(f"{' '.join(cmd[:4])}... exited {p.returncode}: {' / '.join(tail)}")
        ready.write_text(version + "\n")


def ensure_venv(timeout_s: float = 600) -> str:
    """The venv's python, creating the venv first if needed. Raises Unavailable."""
    d = venv_dir()
    build_once(d, [[sys.executable, "-m", "venv", str(d)],
                   [str(_python(d)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"rocketmq-python-client=={RMQ5_VERSION}"],
                   [str(_python(d)), "-c", "import rocketmq.v5, rocketmq; print(rocketmq.Producer)"]],
               RMQ5_VERSION, timeout_s)
    return str(_python(d))


@pytest.fixture(scope="session", name="rmq5_python")
def rmq5_python_fixture() -> str:
    """The Python of a venv holding rocketmq-python-client RMQ5_VERSION (skips when none)."""
    try:
        return ensure_venv()
    except Unavailable as e:
        if os.environ.get("POCKETMQ_REQUIRE_RMQ5"):
            raise
        pytest.skip(f"rocketmq-python-client {RMQ5_VERSION} cannot be installed in a venv here: {e}")


def run_driver(python: str, endpoint: str, scenario: str, timeout_s: float = 60, **args) -> list[dict]:
    """Run one driver scenario; its JSON events (one per stdout line). A non-zero exit or a
    timeout fails with the driver's stderr tail (the client logs there)."""
    import tempfile
    # the client writes its logs under ~/logs; removed afterwards (the stderr tail is in the error)
    with tempfile.TemporaryDirectory(prefix="rmq5home") as home:
        env = dict(os.environ, PYTHONUNBUFFERED="1", HOME=home)
        env.pop("PYTHONPATH", None)       # nothing of the checkout: the client's own world only
        return run_events([python, str(DRIVER), endpoint, scenario, json.dumps(args)], env, home,
                          f"rmq5 driver {scenario}", timeout_s)


def run_events(cmd: list[str], env: dict, cwd: str, what: str, timeout_s: float) -> list[dict]:
    """Run a driver process; the JSON objects it printed one per stdout line. A non-zero exit
    or a timeout fails with its stderr tail."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"{what} timed out after {timeout_s}s; stderr tail:\n{err[-3000:]}")
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0:
        raise AssertionError(f"{what} exited {p.returncode}; events {events}; stderr tail:\n{p.stderr[-3000:]}")
    return events
