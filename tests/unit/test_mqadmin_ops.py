"""The pure parts behind the operations commands (issue 12, item 3): rewriting a broker's
-c file, the run-time-updatable key rule, the broker processors of GET/UPDATE_BROKER_CONFIG,
GET_PRODUCER_CONNECTION_LIST and CLONE_GROUP_OFFSET over a context (no sockets), and the
mqadmin helpers that need no server. The commands against real daemons are in
tests/integration/test_mqadmin_ops.py."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from pocketmq.broker.config import RUNTIME_UPDATABLE_KEYS, BrokerConfig, parse_runtime_update
from pocketmq.broker.processors import build_processor_table
from pocketmq.common.properties_file import ConfigError, parse_properties, set_properties
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.broker import format_config
from pocketmq.tools.mqadmin.command import rw_perm
from pocketmq.tools.mqadmin.consume import queue_range
from tests.unit.test_broker_processors import Env, send_cmd


def entries(text: str) -> list[tuple[str, str]]:
    return [(e.key, e.value) for e in parse_properties(text)]


# -- set_properties: the -c file rewrite ---------------------------------------------------------

class TestSetProperties:
    def test_replaces_in_place_and_keeps_comments_and_order(self):
        text = "# broker-a\nbrokerName=broker-a\n\n! note\nbrokerPermission = 6\nlistenPort=10911\n"
        out = set_properties(text, {"brokerPermission": "4"})
        assert out == "# broker-a\nbrokerName=broker-a\n\n! note\nbrokerPermission=4\nlistenPort=10911\n"

    def test_appends_a_missing_key_and_keeps_crlf(self):
        out = set_properties("a=1\r\nb=2\r\n", {"c": "3"})
        assert out == "a=1\r\nb=2\r\nc=3\r\n"
        assert set_properties("", {"k": "v"}) == "k=v\n"

    def test_last_duplicate_wins_and_earlier_ones_go(self):
        out = set_properties("k=1\nx=0\nk=2\n", {"k": "9"})
        assert entries(out) == [("x", "0"), ("k", "9")]

    def test_continuation_lines_of_the_replaced_entry_go(self):
        out = set_properties("k=long\\\n   value\nother=1\n", {"k": "short"})
        assert entries(out) == [("k", "short"), ("other", "1")]
        assert "value" not in out

    def test_values_round_trip_through_the_parser(self):
        for value in (" leading blank", "a=b:c", "back\\slash", "#hash", "tab\there", ""):
            assert entries(set_properties("", {"key": value})) == [("key", value)], value

    def test_keys_written_escaped_are_matched_unescaped(self):
        out = set_properties("my\\ key=1\n", {"my key": "2"})
        assert entries(out) == [("my key", "2")]


# -- which keys may change at run time ------------------------------------------------------------

class TestRuntimeUpdate:
    def config(self):
        return BrokerConfig(storePathRootDir="/tmp/x", brokerIP1="127.0.0.1")

    def test_accepted_keys_are_typed(self):
        typed = parse_runtime_update(self.config(), {"brokerPermission": "4", "longPollingEnable": "FALSE",
                                                     "deleteWhen": "01;13"})
        assert typed == {"brokerPermission": 4, "longPollingEnable": False, "deleteWhen": "01;13"}

    def test_every_listed_key_exists(self):
        assert set(RUNTIME_UPDATABLE_KEYS) <= set(BrokerConfig.model_fields)

    @pytest.mark.parametrize("updates, needle", [
        ({"maxMessageSize": "1024"}, "read once at start"),
        ({"listenPort": "1"}, "read once at start"),
        ({"noSuchKey": "1"}, "unknown broker config key"),
        ({"brokerPermission": "abc"}, "bad value for brokerPermission"),
        ({"brokerPermission": "16"}, "bad value for brokerPermission"),
        ({"deleteWhen": "25"}, "bad value for deleteWhen"),
        ({}, "no key"),
    ])
    def test_refusals_name_the_reason(self, updates, needle):
        cfg = self.config()
        with pytest.raises(ConfigError) as e:
            parse_runtime_update(cfg, updates)
        assert needle in e.value.detail
        assert cfg.brokerPermission == 6        # the live config is never touched by the check

    def test_refusing_a_start_only_key_lists_the_changeable_ones(self):
        with pytest.raises(ConfigError) as e:
            parse_runtime_update(self.config(), {"flushDiskType": "SYNC_FLUSH"})
        assert "brokerPermission" in e.value.detail and "autoCreateTopicEnable" in e.value.detail


# -- the broker processors ---------------------------------------------------------------------------

def with_config_path(env: Env, path) -> Env:
    env.ctx = dataclasses.replace(env.ctx, config_path=str(path) if path else None)
    env.table = build_processor_table(env.ctx)
    return env


def update_cmd(**kv) -> RemotingCommand:
    body = "".join(f"{k}={v}\n" for k, v in kv.items()).encode()
    return RemotingCommand(R.UPDATE_BROKER_CONFIG, body=body)


class TestBrokerConfigProcessors:
    def test_update_applies_live_and_writes_the_config_file(self, tmp_path):
        conf = tmp_path / "broker.conf"
        conf.write_text("# mine\nbrokerClusterName=DefaultCluster\nbrokerPermission=6\n")
        env = with_config_path(Env(tmp_path / "s"), conf)
        assert env.call(send_cmd("T")).code == C.SUCCESS
        changes, version = env.topic_changes, env.ctx.topics.data_version
        r = env.call(update_cmd(brokerPermission=4))
        assert (r.code, r.remark) == (C.SUCCESS, None)
        assert env.ctx.config.brokerPermission == 4
        # re-registered with a new data version: the routes take the broker's perm
        assert env.topic_changes == changes + 1 and env.ctx.topics.data_version != version
        assert conf.read_text() == "# mine\nbrokerClusterName=DefaultCluster\nbrokerPermission=4\n"
        # live: the next send is refused
        assert env.call(send_cmd("T")).code == C.NO_PERMISSION
        r = env.call(RemotingCommand(R.GET_BROKER_CONFIG))
        assert r.code == C.SUCCESS
        props = dict(entries(r.body_bytes().decode()))
        assert props["brokerPermission"] == "4" and props["brokerName"] == "broker-a"
        assert json.loads(r.ext_fields["version"])["counter"] == 1

    def test_refused_update_changes_nothing(self, tmp_path):
        conf = tmp_path / "broker.conf"
        conf.write_text("brokerPermission=6\n")
        env = with_config_path(Env(tmp_path / "s"), conf)
        r = env.call(update_cmd(brokerPermission=4, maxMessageSize=10))
        assert r.code == C.SYSTEM_ERROR and "maxMessageSize is read once at start" in r.remark
        assert env.ctx.config.brokerPermission == 6 and conf.read_text() == "brokerPermission=6\n"
        r = env.call(RemotingCommand(R.UPDATE_BROKER_CONFIG, body=b""))
        assert r.code == C.SYSTEM_ERROR and "no key" in r.remark

    def test_without_a_config_file_the_remark_says_not_persisted(self, tmp_path):
        env = with_config_path(Env(tmp_path / "s"), None)
        r = env.call(update_cmd(longPollingEnable="false"))
        assert r.code == C.SUCCESS and "not persisted" in r.remark
        assert env.ctx.config.longPollingEnable is False

    def test_unwritable_config_file_refuses_and_applies_nothing(self, tmp_path):
        (tmp_path / "plain").write_text("")
        env = with_config_path(Env(tmp_path / "s"), tmp_path / "plain" / "broker.conf")   # parent is a file
        r = env.call(update_cmd(brokerPermission=4))
        assert r.code == C.SYSTEM_ERROR and env.ctx.config.brokerPermission == 6

    def test_auto_create_topic_switch_is_live(self, tmp_path):
        env = with_config_path(Env(tmp_path / "s"), None)
        assert env.call(update_cmd(autoCreateTopicEnable="false")).code == C.SUCCESS
        assert env.call(send_cmd("NewTopic1")).code == C.TOPIC_NOT_EXIST
        # a broker started with it off has no TBW102: enabling creates the template
        del env.ctx.topics.topics["TBW102"]
        changes = env.topic_changes
        assert env.call(update_cmd(autoCreateTopicEnable="true")).code == C.SUCCESS
        assert env.ctx.topics.get("TBW102") is not None and env.topic_changes > changes
        assert env.ctx.topics.is_system_topic("TBW102")
        assert env.call(send_cmd("NewTopic2")).code == C.SUCCESS

    def test_auto_create_subscription_group_switch_is_live(self, tmp_path):
        env = with_config_path(Env(tmp_path / "s"), None)
        assert env.call(update_cmd(autoCreateSubscriptionGroup="false")).code == C.SUCCESS
        assert env.ctx.groups.find("unknown_group") is None


class TestProducerConnectionAndClone:
    def heartbeat(self, env, group, client_id):
        body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": group}],
                           "consumerDataSet": []}).encode()
        r = env.call(RemotingCommand(R.HEART_BEAT, body=body))
        assert r.code == C.SUCCESS

    def test_producer_connection_list(self, tmp_path):
        env = Env(tmp_path)
        r = env.call(RemotingCommand(R.GET_PRODUCER_CONNECTION_LIST, ext_fields={"producerGroup": "PG"}))
        assert (r.code, r.remark) == (C.SYSTEM_ERROR, "the producer group[PG] not exist")
        self.heartbeat(env, "PG", "10.0.0.7@p1")
        r = env.call(RemotingCommand(R.GET_PRODUCER_CONNECTION_LIST, ext_fields={"producerGroup": "PG"}))
        assert r.code == C.SUCCESS
        (c,) = json.loads(r.body_bytes())["connectionSet"]
        assert c["clientId"] == "10.0.0.7@p1" and c["clientAddr"] == env.conn.remote_addr
        assert c["language"] == "JAVA" and isinstance(c["version"], int)

    def clone(self, env, src, dest, topic=None, offline=False):
        ext = {"srcGroup": src, "destGroup": dest, "offline": "true" if offline else "false"}
        if topic:
            ext["topic"] = topic
        return env.call(RemotingCommand(R.CLONE_GROUP_OFFSET, ext_fields=ext))

    def test_clone_group_offset(self, tmp_path):
        env = Env(tmp_path)
        for t in ("T1", "T2"):
            assert env.call(send_cmd(t)).code == C.SUCCESS
        offsets = env.ctx.offsets
        offsets.commit("src", "T1", 0, 5)
        offsets.commit("src", "T1", 1, 7)
        offsets.commit("src", "T2", 0, 3)
        r = self.clone(env, "src", "dest", "T1")
        assert r.code == C.SUCCESS and r.ext_fields["clonedTopicCount"] == "1"
        assert (offsets.query("dest", "T1", 0), offsets.query("dest", "T1", 1)) == (5, 7)
        assert offsets.query("dest", "T2", 0) == -1
        # no topic: every topic src committed on
        assert self.clone(env, "src", "all", None).ext_fields["clonedTopicCount"] == "2"
        assert offsets.query("all", "T2", 0) == 3
        # nothing to clone is not an error on the broker: the count says 0
        assert self.clone(env, "nobody", "dest", "T1").ext_fields["clonedTopicCount"] == "0"
        # a destination that breaks the name rules is refused before it is stored
        r = self.clone(env, "src", "bad@group", "T1")
        assert r.code == C.SYSTEM_ERROR and "destGroup" in r.remark
        assert "bad@group" not in offsets.groups_of_topic("T1")
        # later commits of src do not leak into dest (a copy, not a shared table)
        offsets.commit("src", "T1", 0, 99)
        assert offsets.query("dest", "T1", 0) == 5


# -- mqadmin helpers ---------------------------------------------------------------------------------

class TestMqadminHelpers:
    def test_queue_range(self):
        assert queue_range(0, 10, None, None, None, 128) == (0, 10, False)
        assert queue_range(0, 10, None, None, None, 4) == (0, 4, True)
        assert queue_range(2, 10, 5, 8, None, 128) == (5, 8, False)       # -s / -e offsets
        assert queue_range(0, 10, None, None, 7, 128) == (7, 10, False)   # -o
        assert queue_range(3, 10, None, None, 1, 128) == (3, 10, False)   # -o below min: from min
        assert queue_range(0, 10, 9, 2, None, 128) == (9, 9, False)       # empty, never negative

    def test_rw_perm(self):
        assert [rw_perm(v) for v in ("2", "4", " 6 ")] == [2, 4, 6]
        for bad in ("0", "7", "x", "1"):
            with pytest.raises(argparse.ArgumentTypeError):
                rw_perm(bad)

    def test_format_config_block(self):
        out = format_config("============1.2.3.4:10911============", {"b": "2", "a": "1"})
        lines = out.splitlines()
        assert lines[0] == "============1.2.3.4:10911============"
        assert lines[1] == "a" + " " * 49 + "=  1" and lines[2].startswith("b ")
        assert out.endswith("\n")

    def test_message_queue_string(self):
        assert tables.message_queue_string("T", "b", 3) == "MessageQueue [topic=T, brokerName=b, queueId=3]"


def test_registration_masks_topic_perms_with_the_broker_permission(tmp_path):
    from pocketmq.broker.app import Broker
    from pocketmq.protocol.bodies import decode_register_broker_body
    cfg = BrokerConfig(storePathRootDir=str(tmp_path), brokerIP1="127.0.0.1")
    broker = Broker(cfg)
    topics, _ = decode_register_broker_body(broker._register_command().body_bytes())
    assert topics["TBW102"].perm == 7
    cfg.brokerPermission = 4
    topics, _ = decode_register_broker_body(broker._register_command().body_bytes())
    assert topics["TBW102"].perm == 4 and all(not tc.perm & 2 for tc in topics.values())
    assert broker.topics.get("TBW102").perm == 7       # the broker's own table keeps its perms


class TestFlagParsing:
    """Java's flag letters land in the names the commands read."""

    @pytest.mark.parametrize("argv, expected", [
        (["producerConnection", "-g", "PG", "-t", "T"], {"group": "PG", "topic": "T"}),
        (["getBrokerConfig", "-b", "1.2.3.4:10911"], {"brokerAddr": "1.2.3.4:10911", "clusterName": None}),
        (["updateBrokerConfig", "-c", "C", "-k", "brokerPermission", "-v", " 4 "],
         {"clusterName": "C", "key": "brokerPermission", "value": "4"}),
        (["wipeWritePerm", "-b", "broker-a"], {"brokerName": "broker-a"}),
        (["addWritePerm", "-b", "broker-a"], {"brokerName": "broker-a"}),
        (["updateKvConfig", "-s", "NS", "-k", "K", "-v", "V"], {"namespace": "NS", "key": "K", "value": "V"}),
        (["deleteKvConfig", "-s", "NS", "-k", "K"], {"namespace": "NS", "key": "K"}),
        (["cleanExpiredCQ"], {"brokerAddr": None, "clusterName": None}),
        (["cloneGroupOffset", "-s", "a", "-d", "b", "-t", "T", "-o", "true"],
         {"srcGroup": "a", "destGroup": "b", "topic": "T", "offline": True}),
        (["cloneGroupOffset", "-s", "a", "-d", "b", "-t", "T"], {"offline": False}),
        (["consumeMessage", "-t", "T", "-b", "B", "-i", "1", "-o", "5", "-c", "3", "-s", "1700000000000"],
         {"topic": "T", "brokerName": "B", "queueId": 1, "offset": 5, "messageNumber": 3,
          "beginTimestamp": 1700000000000, "endTimestamp": None, "consumerGroup": None}),
        (["consumeMessage", "-t", "T"], {"messageNumber": 128}),
        (["updateTopicPerm", "-t", "T", "-c", "C", "-p", "4"], {"topic": "T", "clusterName": "C", "perm": 4}),
        (["topicClusterList", "-t", "T"], {"topic": "T"}),
        (["getNamesrvConfig", "-n", "1.2.3.4:9876"], {"namesrvAddr": "1.2.3.4:9876"}),
    ])
    def test_flags(self, argv, expected):
        from pocketmq.tools.mqadmin.cli import COMMANDS, build_parser
        args = build_parser(COMMANDS[argv[0]]).parse_args(argv[1:])
        for k, v in expected.items():
            assert getattr(args, k) == v, (k, args)

    @pytest.mark.parametrize("argv", [
        ["producerConnection", "-g", "PG"],
        ["updateBrokerConfig", "-b", "a:1", "-k", "k"],
        ["cloneGroupOffset", "-s", "a", "-t", "T"],
        ["consumeMessage", "-t", "T", "-c", "0"],
        ["consumeMessage", "-t", "T", "-i", "-1"],
        ["updateTopicPerm", "-t", "T", "-c", "C", "-p", "3"],
    ])
    def test_bad_command_lines_are_usage_errors(self, argv):
        from pocketmq.tools.mqadmin.cli import COMMANDS, build_parser
        from pocketmq.tools.mqadmin.errors import UsageError
        with pytest.raises(UsageError):
            build_parser(COMMANDS[argv[0]]).parse_args(argv[1:])


# -- client versions as Java's tools name them; no log line past the one-line contract -----------

def test_version_names_follow_java_mqversion_ordinals():
    from pocketmq.protocol.codes import CLIENT_VERSION_DESC, CURRENT_VERSION, VERSION_NAMES, version_desc
    from pocketmq.tools.mqadmin.consumer import version_desc as shown
    assert CLIENT_VERSION_DESC == "V4_9_4" and version_desc(CURRENT_VERSION) == "V4_9_4"
    # ordinals the protocol itself relies on (send_back.py, admin.py), and the C++ 1.2.x client's 63
    assert [version_desc(v) for v in (0, 15, 16, 63, 121, 401)] == [
        "V3_0_0_SNAPSHOT", "V3_0_0_FINAL", "V3_0_1_SNAPSHOT", "V3_1_8", "V3_4_9", "V4_9_4"]
    assert version_desc(VERSION_NAMES.index("V4_1_0_SNAPSHOT")) == "V4_1_0_SNAPSHOT"
    assert version_desc(len(VERSION_NAMES) - 1) == version_desc(10**6) == "HIGHER_VERSION"
    assert len(set(VERSION_NAMES)) == len(VERSION_NAMES)
    assert shown("63") == "V3_1_8" and shown(401) == "V4_9_4" and shown(None) == "" and shown("x") == ""


def test_mqadmin_keeps_pocketmq_warnings_off_stderr(monkeypatch, capsys):
    import logging
    from pocketmq.tools.mqadmin import cli

    def run(argv):
        logging.getLogger("pocketmq.client.query").warning("noise a user must not see")
        return 0
    monkeypatch.delenv("MQADMIN_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_main", run)
    pocket = logging.getLogger("pocketmq")
    before = (pocket.propagate, list(pocket.handlers))
    assert cli.main(["queryMsgByKey"]) == 0
    assert capsys.readouterr().err == ""
    assert (pocket.propagate, list(pocket.handlers)) == before
