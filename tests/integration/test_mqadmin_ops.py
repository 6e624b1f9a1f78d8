"""The operations commands of mqadmin (issue 12, item 3) against a real mqnamesrv and
mqbroker, each with its error path: the CLI runs as a subprocess, like an operator runs it.

The broker runs with a `-c` file, so updateBrokerConfig's write-back can be checked in the
file and across a restart. Tests share one module-scoped cluster and run in file order;
each one leaves the cluster as it found it (perms restored, config keys put back).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid

import pytest

from pocketmq.client import Message
from pocketmq.client import sync
from pocketmq.client.errors import MQClientError
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.support.daemons import Cluster
from tests.support.workloads import poll_until, run_mqadmin

TOPIC = "OpsTopic"
CONF_COMMENT = "# written by the operator; updateBrokerConfig keeps this line"
DEAD_ADDR = "127.0.0.1:1"


def run_cli(*args, env_extra=None):
    return run_mqadmin(*args, env_extra=env_extra, timeout_s=60)


def ok(r) -> str:
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr.strip() == "" or "warning" in r.stderr, r.stderr
    return r.stdout


def assert_clean_failure(r, *needles, code=1):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqadmin: "), r.stderr
    for n in needles:
        assert n in lines[0], r.stderr


def wait_for(predicate, timeout_s=20.0):
    return poll_until(predicate, timeout_s)


def raw(addr: str, code: int, ext: dict) -> RemotingCommand:
    async def go():
        client = RemotingClient()
        try:
            return await client.invoke(addr, RemotingCommand(code, ext_fields=ext), 5.0)
        finally:
            await client.close()
    return asyncio.run(asyncio.wait_for(go(), 15))


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mqadmin_ops"))
    conf = os.path.join(root, "broker.conf")
    with open(conf, "w") as f:
        f.write(f"{CONF_COMMENT}\nbrokerClusterName=DefaultCluster\nbrokerName=broker-a\n")
    c = Cluster(root, broker_args=["-c", conf])
    c.conf = conf
    try:
        c.start()
    except Exception as e:  # noqa: BLE001 - report any start failure as a test failure
        c.stop()
        pytest.fail(f"cluster did not start: {e}")
    # the topic most tests use, routable before the first of them runs
    ok(run_cli("updateTopic", "-n", c.namesrv_addr, "-c", "DefaultCluster", "-t", TOPIC, "-r", "4", "-w", "4"))
    assert wait_for(lambda: route_perms(c) == {6}), "topic not routable"
    yield c
    c.stop()


def ns(cluster):
    return ["-n", cluster.namesrv_addr]


def route_perms(cluster, topic=TOPIC) -> set[int]:
    r = run_cli("topicRoute", *ns(cluster), "-t", topic)
    if r.returncode != 0:
        return set()
    return {qd["perm"] for qd in json.loads(r.stdout)["queueDatas"]}


def send_one(cluster, body: str, group: str = "OpsPG"):
    with sync.Producer(group, cluster.namesrv_addr, instance_name=uniq("p")) as p:
        return p.send(Message(TOPIC, body.encode()))


# --------------------------------------------------------------------------- no server needed

def test_version_flags():
    from pocketmq import __version__
    assert ok(run_cli("--version")).strip() == f"mqadmin (pocketmq) {__version__}"
    import subprocess
    r = subprocess.run([sys.executable, "-m", "pocketmq", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"pocketmq {__version__}", r


@pytest.mark.parametrize("argv, needle", [
    (["updateBrokerConfig", "-n", DEAD_ADDR, "-k", "brokerPermission", "-v", "4"], "needs -b brokerAddr or -c"),
    (["getBrokerConfig", "-n", DEAD_ADDR], "needs -b brokerAddr or -c"),
    (["updateTopicPerm", "-n", DEAD_ADDR, "-t", "T", "-b", DEAD_ADDR, "-p", "5"], "not a topic permission"),
    (["consumeMessage", "-n", DEAD_ADDR, "-t", "T", "-i", "0"], "set -b brokerName with -i queueId"),
    (["updateKvConfig", "-n", DEAD_ADDR, "-s", "NS", "-k", "k"], "-v/--value"),
])
def test_usage_errors_exit_2(argv, needle):
    assert_clean_failure(run_cli(*argv), needle, code=2)


def test_every_new_command_has_help():
    for name in ("producerConnection", "getBrokerConfig", "updateBrokerConfig", "wipeWritePerm", "addWritePerm",
                 "updateKvConfig", "deleteKvConfig", "cleanExpiredCQ", "cloneGroupOffset", "consumeMessage",
                 "updateTopicPerm", "topicClusterList", "getNamesrvConfig"):
        out = ok(run_cli(name, "-h"))
        assert out.startswith(f"usage: mqadmin {name}"), out


# --------------------------------------------------------------------------- nameserver commands

class TestNamesrvCommands:
    def test_get_namesrv_config(self, cluster):
        out = ok(run_cli("getNamesrvConfig", *ns(cluster)))
        assert out.splitlines()[0] == f"============{cluster.namesrv_addr}============"
        props = dict(re.split(r"\s*=  ", ln, maxsplit=1) for ln in out.splitlines()[1:] if "=  " in ln)
        assert props["listenPort"] == str(cluster.ns_port)

    def test_get_namesrv_config_unreachable(self, cluster):
        assert_clean_failure(run_cli("getNamesrvConfig", "-n", DEAD_ADDR), "cannot reach nameserver 127.0.0.1:1")

    def test_kv_config_update_then_delete(self, cluster):
        def get():
            return raw(cluster.namesrv_addr, RequestCode.GET_KV_CONFIG, {"namespace": "OPS_NS", "key": "k1"})

        assert "update kv config in namespace success." in ok(
            run_cli("updateKvConfig", *ns(cluster), "-s", "OPS_NS", "-k", "k1", "-v", "v1"))
        r = get()
        assert (r.code, r.ext_fields.get("value")) == (ResponseCode.SUCCESS, "v1")
        kv_path = os.path.join(cluster.root, "namesrv", "kvConfig.json")
        assert wait_for(lambda: os.path.exists(kv_path) and "v1" in open(kv_path).read()), "kv not persisted"

        assert "delete kv config from namespace success." in ok(
            run_cli("deleteKvConfig", *ns(cluster), "-s", "OPS_NS", "-k", "k1"))
        assert get().code == ResponseCode.QUERY_NOT_FOUND
        assert wait_for(lambda: "v1" not in open(kv_path).read()), "kv deletion not persisted"

    def test_kv_config_unreachable(self, cluster):
        r = run_cli("updateKvConfig", "-n", DEAD_ADDR, "-s", "OPS_NS", "-k", "k", "-v", "v")
        assert_clean_failure(r, "cannot reach nameserver 127.0.0.1:1")

    def test_wipe_and_add_write_perm_change_the_route(self, cluster):
        out = ok(run_cli("wipeWritePerm", *ns(cluster), "-b", "broker-a"))
        m = re.fullmatch(rf"wipe write perm of broker\[broker-a\] in name server\[{cluster.namesrv_addr}\] OK, (\d+)",
                         out.strip())
        assert m and int(m.group(1)) > 0, out
        try:
            assert route_perms(cluster) == {4}
            # a producer reading the route now finds no writable queue of broker-a
            with pytest.raises(MQClientError):
                send_one(cluster, "refused while wiped")
        finally:
            out = ok(run_cli("addWritePerm", *ns(cluster), "-b", "broker-a"))
        assert re.fullmatch(rf"add write perm of broker\[broker-a\] in name server\[{cluster.namesrv_addr}\] OK, \d+",
                            out.strip()), out
        assert route_perms(cluster) == {6}
        assert send_one(cluster, "accepted again").msg_id

    def test_wipe_unknown_broker(self, cluster):
        assert_clean_failure(run_cli("wipeWritePerm", *ns(cluster), "-b", "no-such-broker"),
                             "broker no-such-broker is not registered", "broker-a")
        assert_clean_failure(run_cli("addWritePerm", *ns(cluster), "-b", "no-such-broker"),
                             "not registered")


# --------------------------------------------------------------------------- topic commands

class TestTopicCommands:
    def test_topic_cluster_list(self, cluster):
        assert ok(run_cli("topicClusterList", *ns(cluster), "-t", TOPIC)).split() == ["DefaultCluster"]
        assert_clean_failure(run_cli("topicClusterList", *ns(cluster), "-t", "NoSuchOpsTopic"),
                             "topic NoSuchOpsTopic does not exist")

    def test_update_topic_perm(self, cluster):
        out = ok(run_cli("updateTopicPerm", *ns(cluster), "-t", TOPIC, "-b", cluster.broker_addr, "-p", "4"))
        assert f"update topic perm from 6 to 4 in {cluster.broker_addr} success." in out
        assert "readQueueNums=4, writeQueueNums=4, perm=R--" in out
        try:
            # the broker re-registers the changed topic: the route follows
            assert wait_for(lambda: route_perms(cluster) == {4})
            with pytest.raises(MQClientError):
                send_one(cluster, "not writable")
            assert "new perm equals to the old one!" in ok(
                run_cli("updateTopicPerm", *ns(cluster), "-t", TOPIC, "-c", "DefaultCluster", "-p", "4"))
        finally:
            out = ok(run_cli("updateTopicPerm", *ns(cluster), "-t", TOPIC, "-c", "DefaultCluster", "-p", "6"))
        assert "update topic perm from 4 to 6" in out
        assert wait_for(lambda: route_perms(cluster) == {6})

    def test_update_topic_perm_errors(self, cluster):
        assert_clean_failure(run_cli("updateTopicPerm", *ns(cluster), "-t", "NoSuchOpsTopic", "-c", "DefaultCluster",
                                     "-p", "4"), "topic NoSuchOpsTopic does not exist")
        assert_clean_failure(run_cli("updateTopicPerm", *ns(cluster), "-t", TOPIC, "-b", "127.0.0.1:2", "-p", "4"),
                             "127.0.0.1:2 is not a master of topic", cluster.broker_addr)


# --------------------------------------------------------------------------- broker config

class TestBrokerConfig:
    def broker_config(self, cluster) -> dict:
        out = ok(run_cli("getBrokerConfig", *ns(cluster), "-b", cluster.broker_addr))
        assert out.splitlines()[0] == f"============{cluster.broker_addr}============"
        return dict(re.split(r"\s*=  ", ln, maxsplit=1) for ln in out.splitlines()[1:] if "=  " in ln)

    def test_get_broker_config(self, cluster):
        props = self.broker_config(cluster)
        assert props["brokerName"] == "broker-a" and props["listenPort"] == str(cluster.broker_port)
        out = ok(run_cli("getBrokerConfig", *ns(cluster), "-c", "DefaultCluster"))
        assert out.splitlines()[0] == f"============Master: {cluster.broker_addr}============"

    def test_get_broker_config_errors(self, cluster):
        assert_clean_failure(run_cli("getBrokerConfig", *ns(cluster), "-c", "NoSuchCluster"),
                             "cluster NoSuchCluster not found")
        assert_clean_failure(run_cli("getBrokerConfig", *ns(cluster), "-b", DEAD_ADDR),
                             "cannot reach broker 127.0.0.1:1")

    def test_update_applies_live_and_writes_the_conf_file(self, cluster):
        out = ok(run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "brokerPermission",
                         "-v", "4"))
        assert out.strip() == f"update broker config success, {cluster.broker_addr}"
        try:
            text = open(cluster.conf).read()
            assert text.startswith(CONF_COMMENT + "\n") and "brokerPermission=4\n" in text
            assert self.broker_config(cluster)["brokerPermission"] == "4"
            # the broker re-registers its topics read-only: producers route around it
            assert wait_for(lambda: route_perms(cluster) == {4})
            with pytest.raises(MQClientError):
                send_one(cluster, "refused: broker read-only")
        finally:
            ok(run_cli("updateBrokerConfig", *ns(cluster), "-c", "DefaultCluster", "-k", "brokerPermission",
                       "-v", "6"))
        assert "brokerPermission=6\n" in open(cluster.conf).read()
        assert wait_for(lambda: route_perms(cluster) == {6})
        ok(run_cli("sendMessage", *ns(cluster), "-t", TOPIC, "-p", "x"))

    def test_update_refuses_start_only_keys_and_bad_values(self, cluster):
        before = open(cluster.conf).read()
        r = run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "maxMessageSize", "-v", "1024")
        assert_clean_failure(r, "maxMessageSize is read once at start", "brokerPermission", "SYSTEM_ERROR")
        r = run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "longPollingEnable",
                    "-v", "perhaps")
        assert_clean_failure(r, "bad value for longPollingEnable")
        r = run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "noSuchKey", "-v", "1")
        assert_clean_failure(r, "unknown broker config key")
        assert open(cluster.conf).read() == before

    def test_update_survives_a_restart(self, cluster):
        ok(run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "shortPollingTimeMills",
                   "-v", "700"))
        cluster.restart_broker()
        assert self.broker_config(cluster)["shortPollingTimeMills"] == "700"
        ok(run_cli("updateBrokerConfig", *ns(cluster), "-b", cluster.broker_addr, "-k", "shortPollingTimeMills",
                   "-v", "1000"))


# --------------------------------------------------------------------------- clients and offsets

class TestClientsAndOffsets:
    def test_producer_connection(self, cluster):
        group = uniq("OpsPG")
        with sync.Producer(group, cluster.namesrv_addr, instance_name=uniq("p")) as p:
            p.send(Message(TOPIC, b"hello"))
            client_id = p.impl.instance.client_id
            out = ok(run_cli("producerConnection", *ns(cluster), "-g", group, "-t", TOPIC))
        (line,) = out.splitlines()
        fields = line.split()
        assert fields[0] == "0001" and fields[1] == client_id and fields[3] == "PYTHON", line
        assert fields[2].startswith("127.0.0.1:")

    def test_producer_connection_errors(self, cluster):
        assert_clean_failure(run_cli("producerConnection", *ns(cluster), "-g", "NobodyPG", "-t", TOPIC),
                             "the producer group[NobodyPG] not online")
        assert_clean_failure(run_cli("producerConnection", *ns(cluster), "-g", "NobodyPG", "-t", "NoSuchOpsTopic"),
                             "topic NoSuchOpsTopic does not exist")

    def commit(self, cluster, group, qid, offset):
        r = raw(cluster.broker_addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": TOPIC, "queueId": str(qid), "commitOffset": str(offset)})
        assert r.code == ResponseCode.SUCCESS, r

    def query(self, cluster, group, qid) -> int | None:
        r = raw(cluster.broker_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": TOPIC, "queueId": str(qid)})
        return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else None

    def test_clone_group_offset(self, cluster):
        src, dest = uniq("ops_src"), uniq("ops_dest")
        self.commit(cluster, src, 0, 1)
        self.commit(cluster, src, 1, 2)
        out = ok(run_cli("cloneGroupOffset", *ns(cluster), "-s", src, "-d", dest, "-t", TOPIC, "-o", "true"))
        assert f"clone group offset success. srcGroup[{src}], destGroup=[{dest}], topic[{TOPIC}]" in out
        assert (self.query(cluster, dest, 0), self.query(cluster, dest, 1)) == (1, 2)

    def test_clone_group_offset_errors(self, cluster):
        r = run_cli("cloneGroupOffset", *ns(cluster), "-s", "never_committed", "-d", "x", "-t", TOPIC)
        assert_clean_failure(r, "group never_committed has no committed offset on topic")
        r = run_cli("cloneGroupOffset", *ns(cluster), "-s", "a", "-d", "b", "-t", "NoSuchOpsTopic")
        assert_clean_failure(r, "topic NoSuchOpsTopic does not exist")

    def test_clean_expired_cq(self, cluster):
        out = ok(run_cli("cleanExpiredCQ", *ns(cluster), "-b", cluster.broker_addr))
        assert f"clean expired consume queues of {cluster.broker_addr}: 0 consume queue file(s) deleted" in out
        assert out.splitlines()[-1] == "success"
        assert ok(run_cli("cleanExpiredCQ", *ns(cluster))).splitlines()[-1] == "success"   # every master

    def test_clean_expired_cq_errors(self, cluster):
        assert_clean_failure(run_cli("cleanExpiredCQ", *ns(cluster), "-c", "NoSuchCluster"),
                             "cluster NoSuchCluster not found")
        assert_clean_failure(run_cli("cleanExpiredCQ", *ns(cluster), "-b", DEAD_ADDR),
                             "cannot reach broker 127.0.0.1:1")


class TestConsumeMessage:
    def test_consume_message_prints_what_was_sent(self, cluster):
        topic = uniq("OpsConsume")
        ok(run_cli("updateTopic", *ns(cluster), "-c", "DefaultCluster", "-t", topic, "-r", "1", "-w", "1"))
        assert wait_for(lambda: run_cli("topicRoute", *ns(cluster), "-t", topic).returncode == 0)
        with sync.Producer("OpsConsumePG", cluster.namesrv_addr, instance_name=uniq("p")) as p:
            ids = [p.send(Message(topic, f"body-{i}".encode())).msg_id for i in range(3)]
        out = ok(run_cli("consumeMessage", *ns(cluster), "-t", topic))
        assert "Consume ok" in out
        bodies = re.findall(r"BODY: (\S+)$", out, re.M)
        assert bodies == ["body-0", "body-1", "body-2"]
        assert re.findall(r"^MSGID: (\S+)", out, re.M) == ids
        assert f"MessageQueue [topic={topic}, brokerName=broker-a, queueId=0] print msg finished. offset=3" in out

        out = ok(run_cli("consumeMessage", *ns(cluster), "-t", topic, "-b", "broker-a", "-i", "0", "-o", "1"))
        assert re.findall(r"BODY: (\S+)$", out, re.M) == ["body-1", "body-2"]
        out = ok(run_cli("consumeMessage", *ns(cluster), "-t", topic, "-c", "1"))
        assert re.findall(r"BODY: (\S+)$", out, re.M) == ["body-0"]
        assert "The older 1 message of the 0 queue will be provided" in out
        # nothing was committed for the tools' group (the broker answers 0 for a group that
        # never committed on a queue starting at 0, as Java's does)
        r = raw(cluster.broker_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "TOOLS_CONSUMER", "topic": topic, "queueId": "0"})
        assert r.code == ResponseCode.QUERY_NOT_FOUND or r.ext_fields["offset"] == "0", r

    def test_consume_message_errors(self, cluster):
        assert_clean_failure(run_cli("consumeMessage", *ns(cluster), "-t", "NoSuchOpsTopic"),
                             "topic NoSuchOpsTopic does not exist")
        assert_clean_failure(run_cli("consumeMessage", *ns(cluster), "-t", TOPIC, "-b", "broker-z", "-i", "0"),
                             "broker broker-z has no master serving topic")
        assert_clean_failure(run_cli("consumeMessage", *ns(cluster), "-t", TOPIC, "-b", "broker-a", "-i", "9"),
                             "not 9")
