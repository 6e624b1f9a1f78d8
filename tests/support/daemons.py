"""Start real `mqnamesrv` / `mqbroker` processes for cluster and interop tests.

Readiness is parsed from each daemon's log line ("boot success" with its
address), never guessed with sleeps. Every wait is bounded.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

READY_NS = re.compile(r"The Name Server boot success\..*address \S+:(\d+)")
READY_BROKER = re.compile(r"The broker\[[^,]+, ([\d.]+):(\d+)\] boot success")


_handed_out: set[int] = set()

# A folder shared by every process of one test run (tests/conftest.py makes it and names it
# here, in the process that starts the run; xdist's workers inherit the variable): a port
# handed out by one worker is claimed there, so no other worker hands it out too. A port is
# picked free but bound by its daemon only later (a compose file's services start one after
# another, seconds apart), and in between another worker's bind check found it free as well
# (CI: a compose broker refused "address already in use").
PORT_CLAIMS_ENV = "POCKETMQ_TEST_PORT_CLAIMS"


def _claim(port: int) -> bool:
    """Claim `port` for this run across processes (True), or False when another process of
    the run claimed it first. Without the shared folder (no test run): True."""
    folder = os.environ.get(PORT_CLAIMS_ENV)
    if not folder:
        return True
    try:
        os.close(os.open(os.path.join(folder, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True         # the folder is gone (the run is ending): this process's own set decides
    return True


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port a daemon can listen on: never one this process handed out before (bind to
    port 0 can give the same port twice in a row: two daemons then fight for it), and
    below the kernel's ephemeral range, so no outgoing connection of the suite takes it
    between this check and the daemon's bind (CI saw both as 'address already in use')."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(2000):
        port = rng.randrange(10000, low) if low > 12000 else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _handed_out and _claim(port):
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port found")


def free_broker_port() -> int:
    """A port P for a broker that derives its HA port (haListenPort = listenPort + 1, as in
    `pocketmq dev`): P and P + 1 both free and neither handed out before, both marked handed
    out (a P from free_port() alone could have P + 1 held by a cluster this process started
    earlier: CI saw `pocketmq dev` refused its broker port that way)."""
    low = _ephemeral_low()
    for _ in range(2000):
        port = free_port()
        # P + 1 below the ephemeral range too (free_port's reason), and a port at all
        if port + 1 in _handed_out or (low > 12000 and port + 1 >= low) or port + 1 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
        if not _claim(port + 1):
            continue
        _handed_out.add(port + 1)
        return port
    raise RuntimeError("no free port pair found")


def _script(name: str) -> list[str]:
    path = shutil.which(name)
    if path:
        return [path]
    module = {"mqnamesrv": "pocketmq.nameserver", "mqbroker": "pocketmq.broker"}[name]
    return [sys.executable, "-m", module]


class Daemon:
    def __init__(self, name: str, args: list[str], ready: re.Pattern, log_path: str, env=None,
                 wrapper: list[str] | None = None, command: list[str] | None = None):
        self.name = name
        self.command = command      # instead of the daemon's script (a test wrapper of it)
        self.args = args
        self.wrapper = wrapper or []     # a command prefix, e.g. rlimit_exec.py (it exec()s the daemon)
        self.ready_re = ready
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.match = None
        self._lines: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout_s: float = 30.0) -> "Daemon":
        self._ready.clear()
        self.match = None
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.wrapper + (self.command or _script(self.name)) + self.args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(timeout_s) or self.match is None:
            self.kill()
            raise RuntimeError(f"{self.name} not ready in {timeout_s}s; log tail:\n" + "".join(self._lines[-40:]))
        return self

    def _pump(self, proc) -> None:
        with open(self.log_path, "a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                self._lines.append(line)
                if len(self._lines) > 2000:
                    del self._lines[:1000]
                if self.match is None:
                    m = self.ready_re.search(line)
                    if m:
                        self.match = m
                        self._ready.set()
        self._ready.set()

    def log_text(self) -> str:
        return "".join(self._lines)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError(f"{self.name} did not stop within {timeout_s}s after SIGTERM")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Cluster:
    """One nameserver and one broker on free loopback ports, store under `root`."""

    def __init__(self, root: str, broker_args: list[str] | None = None):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.ns_port = free_port()
        self.broker_port = free_port()
        # its own free port: listenPort + 1 may be another daemon's
        self.ha_port = free_port()
        self.broker_args = broker_args or []
        self.namesrv = Daemon("mqnamesrv", [f"--listenPort={self.ns_port}",
                                            f"--kvConfigPath={root}/namesrv/kvConfig.json"],
                              READY_NS, os.path.join(root, "namesrv.log"))
        self.broker = self._broker_daemon()

    def _broker_daemon(self) -> Daemon:
        args = ["-n", self.namesrv_addr, f"--listenPort={self.broker_port}", "--brokerIP1=127.0.0.1",
                f"--storePathRootDir={self.root}/store", "--mappedFileSizeCommitLog=67108864"]
        if not any(a.startswith("--haListenPort") for a in self.broker_args):
            args.append(f"--haListenPort={self.ha_port}")
        args += self.broker_args
        return Daemon("mqbroker", args, READY_BROKER, os.path.join(self.root, "broker.log"))

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def start(self) -> "Cluster":
        self.namesrv.start()
        try:
            self.broker.start()
        except Exception:
            self.namesrv.kill()
            raise
        return self

    def restart_broker(self, kill: bool = False) -> None:
        if kill:
            self.broker.kill()
        else:
            self.broker.stop()
        self.broker = self._broker_daemon()
        self.broker.start()

    def stop(self) -> None:
        for d in (self.broker, self.namesrv):
            try:
                d.stop()
            except Exception:
                d.kill()
