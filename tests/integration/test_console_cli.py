"""`pocketmq console` and `pocketmq dev`'s console as commands: dev prints the console's URL
and serves it, the console signs its requests for an ACL cluster with --access-key (and says
what is refused without), and bad command lines exit with one clear line. Plain HTTP (urllib),
no browser: tests/integration/test_console_browser.py drives the pages."""
from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("starlette", reason="the console extra is not installed (pip install 'pocketmq[console]')")

from tests.integration.test_acl_broker import ADMIN, APP, start_acl_cluster  # noqa: E402
from pocketmq.client import sync  # noqa: E402
from tests.support.browser import console_daemon  # noqa: E402
from tests.support.daemons import free_broker_port, free_port  # noqa: E402


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_dev_starts_the_console_and_prints_its_url(tmp_path):
    ns_port, broker_port, console_port = free_port(), free_broker_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pocketmq", "dev", "--dir", str(tmp_path / "dev"),
                             "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--grpc-port", "0",
                             "--console-port", str(console_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("pocketmq dev: nameserver "):       # the ready line comes last
                break
        url = f"http://127.0.0.1:{console_port}/"
        assert f"pocketmq dev: web console {url}\n" in lines, lines
        status, page = get(url + "cluster")
        assert status == 200 and "broker-a" in page and f"127.0.0.1:{broker_port}" in page
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("acl-console")))
    yield c
    c.stop()


def test_console_signs_for_an_acl_cluster(acl_cluster, tmp_path):
    signed = console_daemon(acl_cluster.namesrv_addr, str(tmp_path), "--access-key", ADMIN[0],
                            "--secret-key", ADMIN[1], name="signed")
    unsigned = console_daemon(acl_cluster.namesrv_addr, str(tmp_path), name="unsigned")
    signed.start()
    unsigned.start()
    try:
        base = signed.match.group(1)
        status, page = get(base + "cluster")
        assert status == 200 and "ASYNC_MASTER" in page and 'class="error"' not in page
        status, page = get(base + "topics?show=all")
        assert status == 200 and "TBW102" in page
        # without a key the brokers refuse the admin requests: the page says so, no -1 or blank
        status, page = get(unsigned.match.group(1) + "cluster")
        assert status == 200 and 'class="error"' in page
        # the secret key appears in no page and no log line
        for p in ("cluster", "topics", "groups", "messages"):
            assert ADMIN[1] not in get(base + p)[1]
    finally:
        signed.stop()
        unsigned.stop()
    assert ADMIN[1] not in signed.log_text()


class Browser:
    """urllib with cookies: a session and its CSRF token, as a browser would keep them."""

    def __init__(self, base: str):
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=20) as r:
            return r.read().decode()

    def post(self, path: str, form: dict) -> tuple[int, str]:
        token = re.search(r'data-csrf="([0-9a-f]+)"', self.get("cluster")).group(1)
        data = urllib.parse.urlencode(dict(form, csrf=token)).encode()
        try:
            with self.opener.open(self.base + path, data=data, timeout=20) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def test_acl_page_lists_creates_and_deletes_accounts(acl_cluster, tmp_path):
    console = console_daemon(acl_cluster.namesrv_addr, str(tmp_path), "--access-key", ADMIN[0],
                             "--secret-key", ADMIN[1], name="acl")
    console.start()
    try:
        b = Browser(console.match.group(1))
        page = b.get("acl")
        assert ADMIN[0] in page and APP[0] in page and "AclT=PUB|SUB" in page
        assert ADMIN[1] not in page and APP[1] not in page            # secrets never shown
        # checked before anything is sent: the key length rule, the permission names
        status, page = b.post("acl", {"accessKey": "short", "secretKey": "console-secret"})
        assert status == 400 and "longer than 6" in page
        status, page = b.post("acl", {"accessKey": "consoleUser", "secretKey": "console-secret",
                                      "topicPerms": "OrdersT=READ"})
        assert status == 400 and "OrdersT=READ" in page
        status, page = b.post("acl", {"accessKey": "consoleUser", "secretKey": "console-secret",
                                      "topicPerms": "OrdersT=PUB|SUB", "defaultTopicPerm": "DENY"})
        assert status == 200 and "account consoleUser saved" in page
        got = sync.run(_acl_accounts(acl_cluster))
        assert got["consoleUser"]["topicPerms"] == ["OrdersT=PUB|SUB"]
        assert "consoleUser" in b.get("acl") and "console-secret" not in b.get("acl")
        status, page = b.post("acl/delete", {"accessKey": "consoleUser", "confirm": "consoleUser"})
        assert status == 200 and "account consoleUser deleted" in page
        assert "consoleUser" not in sync.run(_acl_accounts(acl_cluster))
    finally:
        console.stop()
    assert "console-secret" not in console.log_text()


async def _acl_accounts(cluster) -> dict:
    from pocketmq.client.credentials import Credentials
    from pocketmq.tools.mqadmin.session import AdminSession
    s = AdminSession(cluster.namesrv_addr, credentials=Credentials(*ADMIN))
    try:
        d = await s.api.acl_config(cluster.broker_addr)
    finally:
        await s.close()
    return {a["accessKey"]: a for a in d["plainAccessConfigs"]}


def run_console(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    return subprocess.run([sys.executable, "-m", "pocketmq", "console", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_bad_command_lines_exit_with_one_line(tmp_path):
    r = run_console()
    assert r.returncode == 2 and "pass --namesrv" in r.stderr
    users = tmp_path / "users.txt"
    users.write_text("alice:root:scrypt$1$2$3$00$00\n")
    r = run_console("--namesrv", "127.0.0.1:9", "--users", str(users), "--port", str(free_port()))
    assert r.returncode == 1 and "users.txt:1: role must be viewer or admin" in r.stderr
    r = run_console("--namesrv", "nonsense")
    assert r.returncode == 1 and "bad nameserver address" in r.stderr
