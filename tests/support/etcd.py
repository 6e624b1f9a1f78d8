"""Real `etcd` processes for the consensus tests (test tooling, never shipped).

`EtcdServer`: one member on free 127.0.0.1 client and peer ports, its data in a
temporary directory; ready once its /health endpoint answers true (polled, bounded).
`EtcdCluster(n=3)`: n members, each its own ports, `--initial-cluster` listing all.
Flags are etcd 3.4's. Raft timings are short (heartbeat 50 ms, election 500 ms), which
also lowers etcd's minimum lease TTL (1.5 election timeouts) below one second, so a
1 s lease really lasts about a second.

    with EtcdServer() as etcd: ...            # etcd.endpoint == "127.0.0.1:PORT"

    @pytest.fixture
    def etcd(tmp_path):
        yield from serve(tmp_path)

Tests skip, with `SKIP_REASON`, when `etcd_available()` is false.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from tests.support.daemons import free_port

SKIP_REASON = "etcd is not installed (Debian: apt-get install etcd-server; .ci/run installs it)"
START_TIMEOUT_S = 15.0
RAFT_FLAGS = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def etcd_available() -> bool:
    return shutil.which("etcd") is not None


def _healthy(client_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/health", timeout=0.5) as r:
            return json.loads(r.read()).get("health") in ("true", True)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def wait_stopped(pid: int, what: str, timeout_s: float = 5.0) -> None:
    """After SIGSTOP: wait (bounded) until every thread of `pid` is stopped (the stop
    reaches a process's threads after kill() has returned)."""
    deadline = time.monotonic() + timeout_s
    task_dir = f"/proc/{pid}/task"
    while True:
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return      # no /proc (or the process is gone): nothing to wait for
        states = []
        for tid in tids:
            try:
                with open(f"{task_dir}/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass    # a thread that just ended
        if all(st in ("T", "t") for st in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not stopped after SIGSTOP: thread states {states}")
        time.sleep(0.01)


class _Member:
    """One etcd process: its name, ports, data dir and log."""

    def __init__(self, name: str, root: str):
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.data_dir = os.path.join(root, name)
        self.log_path = os.path.join(root, f"{name}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def spawn(self, initial_cluster: str) -> None:
        client_url = f"http://{self.endpoint}"
        args = [shutil.which("etcd") or "etcd", "--name", self.name, "--data-dir", self.data_dir,
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "pocketmq-test", *RAFT_FLAGS]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def wait_ready(self, deadline: float) -> None:
        while not _healthy(self.client_port):
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc and self.proc.returncode
                raise RuntimeError(f"etcd {self.name} exited ({code}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd {self.name} not healthy at {self.endpoint} in time:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_stopped(self, timeout_s: float = 5.0) -> None:
        wait_stopped(self.proc.pid, f"etcd {self.name}", timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)      # a paused process would not see SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self.proc = None

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.proc = None


class _Root:
    def __init__(self, root: str | None):
        self._tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="etcd-")
        self.root = root if root is not None else self._tmp.name
        os.makedirs(self.root, exist_ok=True)

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


class EtcdServer(_Root):
    """One etcd member (name `default`)."""

    def __init__(self, root: str | None = None):
        super().__init__(root)
        self.member = _Member("default", self.root)

    @property
    def endpoint(self) -> str:
        return self.member.endpoint

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "EtcdServer":
        self.member.spawn(f"default={self.member.peer_url}")
        try:
            self.member.wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def pause(self) -> None:
        """SIGSTOP, and wait (bounded) until every thread of it is stopped."""
        self.member.signal(signal.SIGSTOP)
        self.member.wait_stopped()

    def resume(self) -> None:
        self.member.signal(signal.SIGCONT)

    def kill(self) -> None:
        self.member.kill()

    def stop(self) -> None:
        self.member.stop()
        self._cleanup()

    def __enter__(self) -> "EtcdServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EtcdCluster(_Root):
    """n etcd members (e0, e1, ...) forming one cluster."""

    def __init__(self, n: int = 3, root: str | None = None):
        super().__init__(root)
        self.members = [_Member(f"e{i}", self.root) for i in range(n)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "EtcdCluster":
        deadline = time.monotonic() + timeout_s
        try:
            for m in self.members:     # all first: a member is healthy only once there is a quorum
                m.spawn(self.initial_cluster)
            for m in self.members:
                m.wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        self.members[i].kill()

    def restart(self, i: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start member i again on its data dir (it rejoins with what it had)."""
        m = self.members[i]
        m.stop()
        m.spawn(self.initial_cluster)
        m.wait_ready(time.monotonic() + timeout_s)

    def stop(self) -> None:
        # killed: on SIGTERM a member of a cluster being torn down waits seconds for its peers
        # (measured: 6 s), and the data dirs are thrown away anyway
        for m in self.members:
            m.kill()
        self._cleanup()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(root) -> Iterator[EtcdServer]:
    """The body of a pytest fixture: `yield from serve(tmp_path)`."""
    with EtcdServer(str(root)) as server:
        yield server
