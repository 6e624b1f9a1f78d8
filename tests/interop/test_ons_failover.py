"""ali-ons (npm, pinned in tests/interop/node/package.json; node/ons_agent.js) across an automatic
failover: a 2-replica SYNC_MASTER group in controller mode on a real etcd, the master SIGKILLed
while an ali-ons producer sends in a loop (Producer#send, one after the other) and an ali-ons push
consumer runs, both with ali-ons' default timers (route refresh pollNameServerInteval 30 s from
the client's start, rebalance 10 s, offset commit 5 s). The run and its checks are shared with
the C++ client's test (tests/interop/test_cpp_failover.py, section 4): the time from the kill to
the first SEND_OK stored on the new master and to the consumer's first delivery of a message
stored there (both placed by the store host in their offsetMsgId: ali-ons' SendResult.msgId is
the broker's, and a pulled message's msgId is decoded from its store host and commit-log
offset), every SEND_OK in the new master's commit log, both within RECOVER_WITHIN_S.

What ali-ons 3.12 does here, read from its source (lib/producer/mq_producer.js, lib/mq_client.js):
Producer#send picks the broker's address from its route table (brokerId 0), and a failed send
(the dead master's refused connection) is retried on the same table (4 attempts) and thrown;
nothing refreshes the route but the timer, so sends fail until the next refresh finds the new
master. ali-ons is installed as tests/interop/test_ons_replication.py does (`npm ci`, once).
"""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.test_client_cluster import uniq
from tests.interop.replication_support import ONS_AGENT
from tests.interop.test_cpp_failover import (
    FO_TOPIC,
    KillRun,
    check_kill_run,
    controller_pair,
    kill_master_under_clients,
    offset_msg_port,
)
# the fixture etcd_server
from tests.interop.test_cpp_failover import etcd_server_fixture  # noqa: F401
from tests.interop.test_ons_replication import NODE_DIR, ensure_ali_ons

pytestmark = [pytest.mark.interop, pytest.mark.slow]

# the body "<ofo-<idx>" as the commit log holds it: followed by its record's topic (length, name)
_STORED = re.compile(rb"<ofo-(\d+)" + re.escape(bytes([len(FO_TOPIC)]) + FO_TOPIC.encode()))


@pytest.fixture(scope="module")
def ali_ons():
    ensure_ali_ons()


class OnsFailoverClient:
    name = "ali-ons"
    first_refresh_s = 30.0          # pollNameServerInteval after the client's start, then every 30 s

    def start_producer(self, ns: str, tmp: str) -> subprocess.Popen:
        return subprocess.Popen(["node", ONS_AGENT, "produce", "--ns", ns, "--group", uniq("OnsCtrlFoPG"),
                                 "--topic", FO_TOPIC, "--count", "100000000", "--prefix", "<ofo"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=NODE_DIR)

    def start_consumer(self, ns: str, stop: str) -> subprocess.Popen:
        return subprocess.Popen(["node", ONS_AGENT, "push", "--ns", ns, "--group", uniq("OnsCtrlFoG"),
                                 "--topic", FO_TOPIC, "--stop-file", stop, "--seconds", "150"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=NODE_DIR)

    @staticmethod
    def ok(e) -> bool:
        return e.get("status") == "SEND_OK"

    @staticmethod
    def msg_idx(m) -> int | None:
        mt = re.fullmatch(r"<ofo-(\d+)", m["body"])
        return int(mt.group(1)) if mt else None

    @staticmethod
    def stored_idx(log: bytes) -> set[int]:
        return {int(i) for i in _STORED.findall(log)}

    @staticmethod
    def on_new_master(run: KillRun, e) -> bool:
        return offset_msg_port(e.get("msg_id")) == run.new_port

    @staticmethod
    def delivered_from_new_master(run: KillRun, m) -> bool:
        return offset_msg_port(m.get("msg_id")) == run.new_port


@pytest.mark.release
@pytest.mark.timeout(200)
async def test_ons_clients_follow_a_sigkilled_master_to_the_elected_slave(ali_ons, etcd_server, tmp_path):
    client = OnsFailoverClient()
    async with controller_pair(str(tmp_path / "group"), etcd_server.endpoint) as (g, m, s):
        run = await kill_master_under_clients(client, g, m, s, str(tmp_path))
    check_kill_run(client, run)
    # the placement by offsetMsgId agrees with the timing: nothing begun once the old master was
    # dead was stored elsewhere
    elsewhere = [e for e in run.acked(client).values() if e["t0"] > run.t_dead and not client.on_new_master(run, e)]
    assert not elsewhere, (run.t_kill, run.t_dead, elsewhere[:5])
