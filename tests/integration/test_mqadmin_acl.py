"""mqadmin's ACL commands (updateAclConfig, deleteAclConfig, clusterAclConfigVersion,
updateGlobalWhiteAddr, getAclConfig) as subprocesses against a real nameserver and broker
with aclEnable, signed by an admin account from $ROCKETMQ_ACCESS_KEY/$ROCKETMQ_SECRET_KEY:
an account created is listed, usable from our Producer, deleted and then refused; the
global white list replaced; the ACL version's counter moves; denies and failures are one
clear line."""
from __future__ import annotations

import asyncio
import re

import pytest

from pocketmq.client import AclDeniedError, Message, Producer
from tests.integration.test_acl_broker import ADMIN, APP, start_acl_cluster
from tests.integration.test_client_acl import ensure_topic, uniq
from tests.support.workloads import run_mqadmin

pytestmark = [pytest.mark.slow]

NEW = ("mqadminUser1", "mqadminSecret1")
AS_ADMIN = {"ROCKETMQ_ACCESS_KEY": ADMIN[0], "ROCKETMQ_SECRET_KEY": ADMIN[1]}
CLUSTER = "DefaultCluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("mqadmin-acl")))
    yield c
    c.stop()


def admin(cluster, *args, env=AS_ADMIN):
    return run_mqadmin(args[0], "-n", cluster.namesrv_addr, *args[1:], env_extra=env)


def ok(r) -> str:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def version_counter(cluster) -> int:
    out = ok(admin(cluster, "clusterAclConfigVersion", "-c", CLUSTER))
    lines = out.splitlines()
    assert lines[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#Broker", "Addr",
                                "#AclConfigVersionNum", "#AclLastUpdateTime"]
    row = lines[1].split()
    assert row[0] == CLUSTER and row[2] == cluster.broker_addr, out
    assert lines[-1] == "get cluster's plain access config version success."
    return int(row[3])


def accounts(cluster) -> dict[str, dict[str, str]]:
    out = ok(admin(cluster, "getAclConfig", "-b", cluster.broker_addr))
    found, current = {}, None
    for line in out.splitlines():
        m = re.match(r"^  (\w+)\s*: ?(.*)$", line)
        if m is None:
            continue
        if m.group(1) == "accessKey":
            current = found.setdefault(m.group(2), {})
        current[m.group(1)] = m.group(2)
    return found


async def send_as(cluster, creds, topic):
    async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), credentials=creds,
                        retry_times_when_send_failed=0) as p:
        return await p.send(Message(topic, b"from an mqadmin-made account"))


def test_account_lifecycle(cluster):
    asyncio.run(ensure_topic(cluster, "MqaT"))
    before = version_counter(cluster)
    assert ADMIN[0] in accounts(cluster)

    out = ok(admin(cluster, "updateAclConfig", "-c", CLUSTER, "-a", NEW[0], "-s", NEW[1],
                   "-i", "DENY", "-u", "SUB", "-t", "MqaT=PUB,OtherT=DENY", "-g", "G1=SUB", "-m", "false"))
    assert f"create or update plain access config to {cluster.broker_addr} success." in out
    assert f"create or update plain access config to cluster {CLUSTER} success." in out
    assert NEW[1] not in out                      # the secret is not echoed
    listed = accounts(cluster)[NEW[0]]
    assert listed["topicPerms"] == "[MqaT=PUB, OtherT=DENY]"
    assert listed["groupPerms"] == "[G1=SUB]"
    assert listed["defaultTopicPerm"] == "DENY" and listed["admin"] == "false"
    assert version_counter(cluster) > before

    result = asyncio.run(send_as(cluster, NEW, "MqaT"))
    assert result.msg_id

    after_create = version_counter(cluster)
    out = ok(admin(cluster, "deleteAclConfig", "-b", cluster.broker_addr, "-a", NEW[0]))
    assert out.strip() == f"delete plain access config account from {cluster.broker_addr} success."
    assert NEW[0] not in accounts(cluster)
    assert version_counter(cluster) > after_create
    with pytest.raises(AclDeniedError) as denied:
        asyncio.run(send_as(cluster, NEW, "MqaT"))
    assert f"No acl config for {NEW[0]}" in str(denied.value)


def test_update_global_white_addr(cluster):
    before = version_counter(cluster)
    out = ok(admin(cluster, "updateGlobalWhiteAddr", "-c", CLUSTER, "-g", "10.250.250.*,192.168.77.*"))
    assert out.strip() == f"update global white remote addresses to {cluster.broker_addr} success."
    listing = ok(admin(cluster, "getAclConfig", "-c", CLUSTER))
    assert "globalWhiteRemoteAddresses: [10.250.250.*, 192.168.77.*]" in listing
    assert version_counter(cluster) > before


def test_cluster_acl_config_version_one_broker(cluster):
    out = ok(admin(cluster, "clusterAclConfigVersion", "-b", cluster.broker_addr))
    row, done = out.splitlines()
    assert row.split()[:3] == [CLUSTER, "broker-a", cluster.broker_addr] or row.split()[2] == cluster.broker_addr
    assert done == "get broker's plain access config version success."


@pytest.mark.parametrize("env, who", [
    ({}, "an unsigned session"),
    ({"ROCKETMQ_ACCESS_KEY": APP[0], "ROCKETMQ_SECRET_KEY": APP[1]}, f"account {APP[0]}"),
])
def test_denied_is_one_clear_line(cluster, env, who):
    r = admin(cluster, "getAclConfig", "-b", cluster.broker_addr, env=env)
    assert r.returncode == 1 and r.stdout == ""
    line = r.stderr.strip()
    assert "\n" not in line
    assert line.startswith("mqadmin: get plain access config denied by the ACL of broker"), line
    assert who in line
    reason = "No accessKey is configured" if not env else "Need admin permission for request code=54"
    assert reason in line, line


def test_failures_name_the_code(cluster):
    r = admin(cluster, "deleteAclConfig", "-b", cluster.broker_addr, "-a", "noSuchUser1")
    assert r.returncode == 1
    assert "DELETE_ACL_CONFIG_FAILED" in r.stderr and "noSuchUser1" in r.stderr, r.stderr
    r = admin(cluster, "updateAclConfig", "-b", cluster.broker_addr, "-a", "badPermUser", "-s", "badPermSecret",
              "-t", "TopicX=NOPE")
    assert r.returncode == 1
    assert "UPDATE_AND_CREATE_ACL_CONFIG_FAILED" in r.stderr, r.stderr
    r = admin(cluster, "updateAclConfig", "-b", cluster.broker_addr, "-a", "x", "-s", "y")
    assert r.returncode == 1 and "UPDATE_AND_CREATE_ACL_CONFIG_FAILED" in r.stderr, r.stderr
    r = admin(cluster, "getAclConfig")
    assert r.returncode == 2 and "needs -b brokerAddr or -c clusterName" in r.stderr
