"""Plain ACL against real mqnamesrv / mqbroker processes, signing raw RemotingCommands with
protocol/acl.sign_request (what the C++ client and ali-ons send): allowed sends and pulls,
each deny with Java 4.9's answer and nothing stored, hot reload, the admin codes, the
nameserver's protected writes, /metrics."""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request

import pytest

from pocketmq.protocol import bodies
from pocketmq.protocol.acl import sign_request
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster, free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

ADMIN = ("adminUser", "adminSecret1")
APP = ("appUser01", "appSecret01")
BROKER_SELF = ("brokerSelf", "brokerSecret1")
AE = "org.apache.rocketmq.acl.common.AclException: "
PPM = "org.apache.rocketmq.acl.plain.PlainPermissionManager"

ACL_YML = f"""\
# pocketmq's ACL test file
globalWhiteRemoteAddresses: [10.250.250.*]
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {BROKER_SELF[0]}
    secretKey: {BROKER_SELF[1]}
    admin: true
  - accessKey: {APP[0]}
    secretKey: {APP[1]}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [AclT=PUB|SUB, OnsT=PUB|SUB, SubOnlyT=SUB]
    groupPerms: [DeniedG=DENY]
"""


def signed(cmd: RemotingCommand, creds) -> RemotingCommand:
    cmd.ext_fields = sign_request(cmd.ext_fields or {}, cmd.body, *creds)
    return cmd


def start_acl_cluster(root: str) -> Cluster:
    """A nameserver and a broker with ACL on (ACL_YML for both; the broker signs its
    registration as BROKER_SELF, an admin account); `.acl_path`, `.metrics_port` set."""
    conf = os.path.join(root, "broker.conf")
    metrics = free_port()
    with open(conf, "w") as f:
        f.write(f"aclEnable=true\naccessKey={BROKER_SELF[0]}\nsecretKey={BROKER_SELF[1]}\n"
                f"metricsPort={metrics}\n")
    with open(os.path.join(root, "plain_acl.yml"), "w") as f:
        f.write(ACL_YML)
    ns_dir = os.path.join(root, "ns")
    os.makedirs(ns_dir)
    with open(os.path.join(ns_dir, "plain_acl.yml"), "w") as f:
        f.write(ACL_YML)
    c = Cluster(root, broker_args=["-c", conf])
    c.namesrv.args += ["--aclEnable=true", f"--aclFilePath={ns_dir}/plain_acl.yml"]
    c.metrics_port = metrics
    c.acl_path = os.path.join(root, "plain_acl.yml")
    c.start()
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("acl")))
    yield c
    c.stop()


@pytest.fixture
async def client():
    cl = RemotingClient()
    yield cl
    await cl.close()


async def max_offset(client, addr, topic, queue_id=0) -> int:
    r = await client.invoke(addr, signed(RemotingCommand(R.GET_MAX_OFFSET, ext_fields={
        "topic": topic, "queueId": str(queue_id)}), ADMIN))
    return int(r.ext_fields["offset"]) if r.code == C.SUCCESS else 0


async def test_permitted_account_sends_and_pulls(cluster, client):
    r = await client.invoke(cluster.broker_addr, signed(send_cmd("AclT", b"hello", queue_id=0), APP))
    assert r.code == C.SUCCESS, r.remark
    p = await client.invoke(cluster.broker_addr, signed(pull_cmd("AclT", 0, 0, group="AppG"), APP))
    assert p.code == C.SUCCESS, p.remark
    assert b"hello" in p.body


@pytest.mark.parametrize("case", ["wrong secret", "unknown key", "no signature", "no AccessKey", "no PUB",
                                  "PUB on a SUB-only topic"])
async def test_refused_sends_store_nothing(cluster, client, case):
    topic = {"no PUB": "OtherT", "PUB on a SUB-only topic": "SubOnlyT"}.get(case, "AclT")
    before = await max_offset(client, cluster.broker_addr, topic)
    cmd = send_cmd(topic, b"must not be stored", queue_id=0)
    if case == "wrong secret":
        signed(cmd, (APP[0], "notTheSecret"))
        want = f"Check signature failed for accessKey={APP[0]}, {PPM}.validate(PlainPermissionManager.java:684)"
    elif case == "unknown key":
        signed(cmd, ("strangerKey", "strangerSecret"))
        want = f"No acl config for strangerKey, {PPM}.validate(PlainPermissionManager.java:668)"
    elif case == "no signature":
        cmd.ext_fields = dict(cmd.ext_fields, AccessKey=APP[0])
        want = f"Check signature failed for accessKey={APP[0]}, {PPM}.validate(PlainPermissionManager.java:684)"
    elif case == "no AccessKey":
        want = f"No accessKey is configured, {PPM}.validate(PlainPermissionManager.java:664)"
    else:
        signed(cmd, APP)
        line = 606 if case == "no PUB" else 611
        want = f"No default permission for topic:{topic}, {PPM}.checkPerm(PlainPermissionManager.java:{line})"
    r = await client.invoke(cluster.broker_addr, cmd)
    assert (r.code, r.remark) == (C.SYSTEM_ERROR, AE + want)
    assert await max_offset(client, cluster.broker_addr, topic) == before


async def test_pull_without_sub_on_the_group_is_refused(cluster, client):
    r = await client.invoke(cluster.broker_addr, signed(pull_cmd("AclT", 0, 0, group="DeniedG"), APP))
    assert r.code == C.SYSTEM_ERROR
    assert r.remark == AE + f"No default permission for group:DeniedG, {PPM}.checkPerm(PlainPermissionManager.java:611)"
    r = await client.invoke(cluster.broker_addr, signed(pull_cmd("OtherT", 0, 0, group="AppG"), APP))
    assert r.remark.startswith(AE + "No default permission for topic:OtherT")


async def test_admin_codes_need_an_admin_account(cluster, client):
    cmd = signed(RemotingCommand(R.UPDATE_AND_CREATE_TOPIC, ext_fields={
        "topic": "MadeByApp", "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}), APP)
    r = await client.invoke(cluster.broker_addr, cmd)
    assert r.remark == AE + (f"Need admin permission for request code=17, but accessKey={APP[0]} is not, "
                             f"{PPM}.checkPerm(PlainPermissionManager.java:581)")
    r = await client.invoke(cluster.broker_addr, signed(RemotingCommand(R.GET_BROKER_CLUSTER_ACL_CONFIG), APP))
    assert "Need admin permission for request code=54" in r.remark


async def test_oneway_denied_gets_no_answer(cluster, client):
    from pocketmq.protocol.codes import FLAG_ONEWAY
    from pocketmq.protocol.command import encode
    from tests.support.raw_client import connect
    before = await max_offset(client, cluster.broker_addr, "AclT")
    raw = await connect(cluster.broker_addr)
    try:
        oneway = send_cmd("AclT", b"oneway, unsigned")
        oneway.flag |= FLAG_ONEWAY
        oneway.opaque = 777
        raw.transport.write(encode(oneway))
        # a signed request after it on the same connection is answered; the oneway got nothing
        r = await raw.call(signed(send_cmd("AclT", b"after"), APP), 778)
        assert r.code == C.SUCCESS, r.remark
        assert raw.responses == []
    finally:
        raw.transport.close()
    assert await max_offset(client, cluster.broker_addr, "AclT") == before + 1


async def poll_until(make, ok, timeout_s: float = 8.0):
    t0 = time.monotonic()
    while True:
        r = await make()
        if ok(r):
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout_s, f"not in {timeout_s} s: {r.code} {r.remark}"
        await asyncio.sleep(0.1)


async def test_hot_reload_grants_revokes_and_survives_a_broken_file(cluster, client):
    path = cluster.acl_path
    original = open(path).read()

    async def send():
        return await client.invoke(cluster.broker_addr, signed(send_cmd("GrantT", b"x"), APP))
    try:
        assert (await send()).code == C.SYSTEM_ERROR
        with open(path, "w") as f:
            f.write(original.replace("SubOnlyT=SUB]", "SubOnlyT=SUB, GrantT=PUB]"))
        granted_s = await poll_until(send, lambda r: r.code == C.SUCCESS)
        assert granted_s < 5.0
        with open(path, "w") as f:
            f.write(original)
        revoked_s = await poll_until(send, lambda r: r.code == C.SYSTEM_ERROR)
        assert revoked_s < 5.0
        # a broken file changes nothing: the previous accounts stay
        with open(path, "w") as f:
            f.write(original.replace("accounts:", "accounts: [unclosed"))
        await asyncio.sleep(2.5)
        r = await client.invoke(cluster.broker_addr, signed(send_cmd("AclT", b"still"), APP))
        assert r.code == C.SUCCESS, r.remark
        assert "ACL not reloaded, the previous accounts stay in force" in cluster.broker.log_text()
        assert (await send()).code == C.SYSTEM_ERROR
    finally:
        with open(path, "w") as f:
            f.write(original)
        await asyncio.sleep(1.5)
    print(f"\nhot reload: granted after {granted_s:.2f} s, revoked after {revoked_s:.2f} s")


async def test_acl_admin_codes(cluster, client):
    addr = cluster.broker_addr
    newbie = ("newbieUser", "newbieSecret")
    cmd = RemotingCommand(R.UPDATE_AND_CREATE_ACL_CONFIG, ext_fields={
        "accessKey": newbie[0], "secretKey": newbie[1], "admin": "false", "defaultTopicPerm": "PUB",
        "defaultGroupPerm": "SUB", "topicPerms": "NewT=PUB,Other=SUB", "groupPerms": "NG=SUB"})
    r = await client.invoke(addr, signed(cmd, ADMIN))
    assert r.code == C.SUCCESS, r.remark
    r = await client.invoke(addr, signed(send_cmd("NewT", b"n"), newbie))
    assert r.code == C.SUCCESS, r.remark
    text = open(cluster.acl_path).read()
    assert newbie[0] in text and APP[0] in text and "dataVersion" in text
    # too short: 209 with Java's message
    r = await client.invoke(addr, signed(RemotingCommand(R.UPDATE_AND_CREATE_ACL_CONFIG, ext_fields={
        "accessKey": "short", "secretKey": "x"}), ADMIN))
    assert r.code == C.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
    assert "cannot be null and length should longer than 6" in r.remark
    info = await client.invoke(addr, signed(RemotingCommand(R.GET_BROKER_CLUSTER_ACL_INFO), ADMIN))
    assert info.code == C.SUCCESS
    versions = json.loads(info.ext_fields["allAclFileVersion"])
    assert versions[cluster.acl_path]["counter"] >= 1 and info.ext_fields["brokerAddr"] == addr
    conf = await client.invoke(addr, signed(RemotingCommand(R.GET_BROKER_CLUSTER_ACL_CONFIG), ADMIN))
    body = bodies.loads(conf.body)
    assert body["globalWhiteAddrs"] == ["10.250.250.*"]
    assert {a["accessKey"] for a in body["plainAccessConfigs"]} >= {ADMIN[0], APP[0], newbie[0]}
    r = await client.invoke(addr, signed(RemotingCommand(R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, ext_fields={
        "globalWhiteAddrs": "10.250.250.*,10.251.0.1"}), ADMIN))
    assert r.code == C.SUCCESS, r.remark
    r = await client.invoke(addr, signed(RemotingCommand(R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, ext_fields={
        "globalWhiteAddrs": "10.1.1.1", "aclFileFullPath": "/etc/passwd"}), ADMIN))
    assert r.code == C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
    r = await client.invoke(addr, signed(RemotingCommand(R.DELETE_ACL_CONFIG, ext_fields={
        "accessKey": newbie[0]}), ADMIN))
    assert r.code == C.SUCCESS, r.remark
    r = await client.invoke(addr, signed(send_cmd("NewT", b"n"), newbie))
    assert r.remark.startswith(AE + f"No acl config for {newbie[0]}")
    r = await client.invoke(addr, signed(RemotingCommand(R.DELETE_ACL_CONFIG, ext_fields={
        "accessKey": newbie[0]}), ADMIN))
    assert r.code == C.DELETE_ACL_CONFIG_FAILED
    assert r.remark == f"The accesskey[{newbie[0]}] corresponding to accessConfig has been deleted failed."
    # the file keeps the accounts it had
    assert APP[0] in open(cluster.acl_path).read()


async def test_nameserver_refuses_unsigned_register_and_keeps_routes(cluster, client):
    ns = cluster.namesrv_addr
    # the broker signed its own registration (accessKey/secretKey in its config)
    r = await client.invoke(ns, RemotingCommand(R.GET_BROKER_CLUSTER_INFO))
    assert r.code == C.SUCCESS
    before = r.body
    assert cluster.broker_addr.encode() in before
    body = bodies.encode_register_broker_body({}, bodies.DataVersion())
    reg = RemotingCommand(R.REGISTER_BROKER, ext_fields={
        "brokerName": "broker-a", "brokerAddr": "127.0.0.1:1", "clusterName": "DefaultCluster",
        "haServerAddr": "127.0.0.1:2", "brokerId": "0", "compressed": "false", "bodyCrc32": "0"}, body=body)
    r = await client.invoke(ns, reg)
    assert (r.code, r.remark) == (C.SYSTEM_ERROR, AE + f"No accessKey is configured, {PPM}.validate("
                                  "PlainPermissionManager.java:664)")
    r = await client.invoke(ns, signed(RemotingCommand(R.UNREGISTER_BROKER, ext_fields={
        "brokerName": "broker-a", "brokerAddr": cluster.broker_addr, "clusterName": "DefaultCluster",
        "brokerId": "0"}), APP))
    assert "Need admin permission for request code=104" in r.remark
    r = await client.invoke(ns, RemotingCommand(R.PUT_KV_CONFIG, ext_fields={
        "namespace": "ns", "key": "k", "value": "v"}))
    assert r.code == C.SYSTEM_ERROR
    # route reads stay open, and unchanged
    r = await client.invoke(ns, RemotingCommand(R.GET_BROKER_CLUSTER_INFO))
    assert r.body == before
    r = await client.invoke(ns, RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "AclT"}))
    assert r.code == C.SUCCESS and cluster.broker_addr.encode() in r.body


async def test_denies_are_counted_in_metrics(cluster, client):
    await client.invoke(cluster.broker_addr, send_cmd("AclT", b"unsigned"))
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("pocketmq_acl_denied_total")]
    assert any('reason="no_access_key"' in ln and 'code="310"' in ln for ln in lines), lines
    assert any(ln.startswith("pocketmq_acl_accounts") for ln in text.splitlines())


async def test_a_broken_file_refuses_the_start(tmp_path):
    import subprocess
    import sys
    conf = tmp_path / "broker.conf"
    conf.write_text("aclEnable=true\n")
    (tmp_path / "plain_acl.yml").write_text("accounts:\n  - accessKey: abcdefgh\n    secretKey: abcdefgh\n"
                                           "  - accessKey: short\n    secretKey: abc\n")
    argv = [sys.executable, "-m", "pocketmq.broker", "-c", str(conf), f"--listenPort={free_port()}",
            f"--storePathRootDir={tmp_path}/store", "--mappedFileSizeCommitLog=1048576"]
    r = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert (f"broker failed to start: cannot load the ACL: {tmp_path}/plain_acl.yml:4: The accessKey=short and "
            f"secretKey=<3 characters> cannot be null and length should longer than 6") in r.stdout + r.stderr
