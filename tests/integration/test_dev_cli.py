"""`pocketmq dev`: listens on 127.0.0.1 unless --bind says otherwise, and a port in use
is reported with the flag that moves it; a signal sent on reading its ready line (or the
console's) closes it cleanly."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.support.daemons import free_broker_port, free_port
from tests.support.ready_signal import wrapper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads listening sockets from /proc")


def listening(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at `port` (from /proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:
                out.add(socket.inet_ntoa(bytes.fromhex(addr_hex)[::-1]))
    return out


def dev(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pocketmq", "dev", "--dir", str(tmp_path / "dev"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def wait_ready(proc: subprocess.Popen) -> str:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("pocketmq dev: nameserver "):
            return line
    raise AssertionError(f"pocketmq dev ended without its ready line (exit {proc.wait(10)}): {seen}")


@pytest.mark.parametrize(("bind_args", "expected"), [((), "127.0.0.1"), (("--bind", "0.0.0.0"), "0.0.0.0")])
def test_dev_listens_on_loopback_unless_told(tmp_path, bind_args, expected):
    ns_port, broker_port = free_port(), free_broker_port()
    proc = dev(tmp_path, "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), *bind_args)
    try:
        line = wait_ready(proc)
        got = (listening(ns_port), listening(broker_port))
        assert got == ({expected}, {expected}), (got, line)
        where = "every interface" if expected == "0.0.0.0" else expected
        assert f"listening on {where}" in line and f"NAMESRV_ADDR=127.0.0.1:{ns_port}" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.parametrize("flag", ["--namesrv-port", "--broker-port"])
def test_port_in_use_names_the_flag(tmp_path, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = {"--namesrv-port": free_port(), "--broker-port": free_broker_port(), flag: busy}
        proc = dev(tmp_path, "--namesrv-port", str(ports["--namesrv-port"]),
                   "--broker-port", str(ports["--broker-port"]))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"127.0.0.1:{busy}: address already in use" in out
    assert f"pick another port with {flag} PORT" in out


def test_ha_port_in_use_names_it_and_the_flag(tmp_path):
    """The broker's HA port follows its port (listenPort + 1): taken, the error names that
    port, not the broker port, and the flag that moves both."""
    port = free_broker_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        proc = dev(tmp_path, "--namesrv-port", str(free_port()), "--broker-port", str(port), "--grpc-port", "0",
                   "--console-port", "0")
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert (f"the broker cannot listen on its HA port 127.0.0.1:{port + 1} (--broker-port + 1): "
            f"address already in use") in out
    assert "pick another port with --broker-port PORT" in out


def test_bind_takes_an_ip_address(tmp_path):
    proc = dev(tmp_path, "--bind", "my-host")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--bind: not an IP address: 'my-host'" in out


# `pocketmq dev` / `pocketmq console` with their ready line's reader signalling at once
_SIGNAL_AT_READY = wrapper("pocketmq.cli", ("pocketmq dev: nameserver ", "pocketmq console: http"))


@pytest.mark.parametrize("command", ["dev", "console"])
def test_a_signal_as_soon_as_the_ready_line_is_printed_closes_cleanly(tmp_path, command):
    if command == "dev":
        args = ["dev", "--dir", str(tmp_path / "dev"), "--namesrv-port", str(free_port()),
                "--broker-port", str(free_broker_port()), "--console-port", "0"]
    else:
        pytest.importorskip("pocketmq.console.server")
        # the console needs no nameserver to start serving (it asks per request)
        args = ["console", "--namesrv", f"127.0.0.1:{free_port()}", "--port", str(free_port())]
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT_READY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert f"pocketmq {command}: " in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
