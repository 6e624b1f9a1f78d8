"""Subscription groups without sockets: the SubscriptionGroupConfig body (strict, Java's
defaults), the table and subscriptionGroup.json, the admin processors and the rules
that honour a group (send-back, pull) through a BrokerContext, and mqadmin's flags."""
import argparse
import json

import pytest

from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager, validate_group_config
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.bodies import (DataVersion, SubscriptionGroupConfig, decode_subscription_group_wrapper,
                                      dumps, encode_subscription_group_wrapper)
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError, HeaderError
from pocketmq.protocol.message import decode_records
from pocketmq.tools.mqadmin.cli import COMMANDS, build_parser
from pocketmq.tools.mqadmin.subgroup import config_from_flags, group_config_line
from tests.unit.test_broker_processors import Env, pull_cmd, send_cmd

JAVA_DEFAULTS = {"groupName": "G", "consumeEnable": True, "consumeFromMinEnable": True,
                 "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                 "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}


# -- the body ------------------------------------------------------------------------------

def test_config_json_has_javas_keys_and_defaults():
    assert SubscriptionGroupConfig("G").to_json() == JAVA_DEFAULTS
    assert SubscriptionGroupConfig.from_json({"groupName": "G"}) == SubscriptionGroupConfig("G")
    # what fastjson writes for Java's bean, including fields of newer versions we ignore
    cfg = SubscriptionGroupConfig.from_json({**JAVA_DEFAULTS, "retryMaxTimes": 2, "consumeEnable": "false",
                                             "retryQueueNums": "3", "groupSysFlag": 0, "attributes": {}})
    assert (cfg.retryMaxTimes, cfg.consumeEnable, cfg.retryQueueNums) == (2, False, 3)


@pytest.mark.parametrize("body, needle", [
    ([], "not a JSON object"),
    ({}, "needs a groupName"),
    ({"groupName": "  "}, "needs a groupName"),
    ({"groupName": 5}, "needs a groupName"),
    ({"groupName": "G", "consumeEnable": "yes"}, "bad consumeEnable: 'yes'"),
    ({"groupName": "G", "consumeBroadcastEnable": 1}, "bad consumeBroadcastEnable"),
    ({"groupName": "G", "retryMaxTimes": "two"}, "bad retryMaxTimes: 'two'"),
    ({"groupName": "G", "retryQueueNums": True}, "bad retryQueueNums"),
    ({"groupName": "G", "brokerId": 1.5}, "bad brokerId"),
])
def test_bad_config_bodies_name_the_field(body, needle):
    with pytest.raises(BodyError, match=None) as e:
        SubscriptionGroupConfig.from_json(body)
    assert needle in str(e.value)


def test_wrapper_round_trip():
    groups = {"A": SubscriptionGroupConfig("A", retryMaxTimes=3), "B": SubscriptionGroupConfig("B")}
    d = encode_subscription_group_wrapper(groups, DataVersion(7, 2))
    assert set(d) == {"subscriptionGroupTable", "dataVersion"}
    assert decode_subscription_group_wrapper(json.loads(dumps(d))) == (groups, DataVersion(7, 2))
    with pytest.raises(BodyError):
        decode_subscription_group_wrapper({"subscriptionGroupTable": []})


@pytest.mark.parametrize("cfg, needle", [
    (SubscriptionGroupConfig("bad name"), "illegal characters"),
    (SubscriptionGroupConfig("G" * 256), "longer than 255"),
    (SubscriptionGroupConfig("G", retryQueueNums=-1), "retryQueueNums must be in 0..1024"),
    (SubscriptionGroupConfig("G", retryQueueNums=1025), "retryQueueNums must be in 0..1024"),
    (SubscriptionGroupConfig("G", retryMaxTimes=-1), "retryMaxTimes must be >= 0"),
    (SubscriptionGroupConfig("G", brokerId=-1), "brokerId"),
])
def test_group_rules(cfg, needle):
    assert needle in validate_group_config(cfg)
    assert validate_group_config(SubscriptionGroupConfig("G", retryQueueNums=0, retryMaxTimes=0)) is None


def test_manager_persists_and_reloads():
    m = SubscriptionGroupManager(auto_create=False)
    assert m.find("X") is None and not m.dirty
    m.update(SubscriptionGroupConfig("G", retryMaxTimes=2, consumeEnable=False), 10)
    m.update(SubscriptionGroupConfig("H"), 11)
    assert m.dirty and m.data_version == DataVersion(11, 2)
    assert m.delete("H", 12) and not m.delete("H", 13)
    again = SubscriptionGroupManager(auto_create=False)
    again.load(m.encode())
    assert again.table == {"G": SubscriptionGroupConfig("G", retryMaxTimes=2, consumeEnable=False)}
    assert again.data_version == DataVersion(12, 3)
    with pytest.raises(BodyError):
        again.load(b'{"subscriptionGroupTable": {"G": {"groupName": "G", "retryMaxTimes": "x"}}}')


# -- the processors --------------------------------------------------------------------------

def update_cmd(body) -> RemotingCommand:
    data = body if isinstance(body, bytes) else dumps(body)
    return RemotingCommand(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, opaque=3, body=data)


def test_update_get_delete_through_the_context(tmp_path):
    env = Env(tmp_path)
    r = env.call(update_cmd({**JAVA_DEFAULTS, "groupName": "G2", "retryMaxTimes": 2}))
    assert (r.code, r.opaque, env.groups_persisted) == (C.SUCCESS, 3, 1)
    r = env.call(RemotingCommand(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    got = json.loads(r.body)
    assert got["subscriptionGroupTable"]["G2"] == {**JAVA_DEFAULTS, "groupName": "G2", "retryMaxTimes": 2}
    assert got["dataVersion"]["counter"] >= 1
    env.ctx.offsets.commit("G2", "T", 0, 5)
    env.ctx.offsets.commit("G3", "T", 0, 6)
    r = env.call(RemotingCommand(R.DELETE_SUBSCRIPTIONGROUP, ext_fields={"groupName": "G2", "removeOffset": "true"}))
    assert r.code == C.SUCCESS and env.groups_persisted == 2
    assert "G2" not in env.ctx.groups.table
    assert (env.ctx.offsets.query("G2", "T", 0), env.ctx.offsets.query("G3", "T", 0)) == (-1, 6)
    with pytest.raises(HeaderError, match="groupName"):   # the connection answers SYSTEM_ERROR with it
        env.call(RemotingCommand(R.DELETE_SUBSCRIPTIONGROUP, ext_fields={}))


@pytest.mark.parametrize("body, needle", [
    (b"", "no SubscriptionGroupConfig body"),
    (b"{not json", "bad SubscriptionGroupConfig body"),
    (b"\xff\xfe", "bad SubscriptionGroupConfig body"),
    ({"retryMaxTimes": 2}, "needs a groupName"),
    ({"groupName": "G", "retryMaxTimes": "many"}, "bad retryMaxTimes"),
    ({"groupName": "G", "retryMaxTimes": -3}, "retryMaxTimes must be >= 0"),
    ({"groupName": "a b"}, "illegal characters"),
])
def test_bad_update_bodies_are_refused_with_a_remark(tmp_path, body, needle):
    env = Env(tmp_path)
    r = env.call(update_cmd(body))
    assert r.code == C.SYSTEM_ERROR and needle in r.remark, r.remark
    assert env.groups_persisted == 0


def test_a_slave_refuses_group_changes(tmp_path):
    env = Env(tmp_path, brokerRole="SLAVE", brokerId=1)
    r = env.call(update_cmd({"groupName": "G"}))
    assert r.code == C.SYSTEM_ERROR and "slave" in r.remark


def test_retry_max_times_of_the_group_applies_unless_the_request_carries_one(tmp_path):
    env = Env(tmp_path)
    env.call(update_cmd({"groupName": "G", "retryMaxTimes": 1}))
    env.call(send_cmd("T", b"work"))
    (msg,) = decode_records(b"".join(env.call(pull_cmd("T", 0, 0)).body))

    def send_back(offset, **extra):
        cmd = RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
            "offset": str(offset), "group": "G", "delayLevel": "0", **extra})
        cmd.version = 401   # V4_9_x: a maxReconsumeTimes header counts
        return env.call(cmd)

    assert send_back(msg.commit_log_offset).code == C.SUCCESS
    (parked,) = decode_records(b"".join(env.store.get_message(SCHEDULE_TOPIC, 2, 0, 1).buffers))
    assert parked.reconsume_times == 1
    # reconsume_times (1) >= the group's retryMaxTimes (1): dead letter
    assert send_back(parked.commit_log_offset).code == C.SUCCESS
    assert env.store.get_max_offset_in_queue("%DLQ%G", 0) == 1
    # ...unless the request says otherwise (Java: the header wins)
    assert send_back(parked.commit_log_offset, maxReconsumeTimes="5").code == C.SUCCESS
    assert env.store.get_max_offset_in_queue("%DLQ%G", 0) == 1
    assert env.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 3) == 1   # level 4 = 3 + 1


def test_retry_queue_nums_spreads_send_backs_and_resizes_the_retry_topic(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"work"))
    (msg,) = decode_records(b"".join(env.call(pull_cmd("T", 0, 0)).body))
    send_back = RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
        "offset": str(msg.commit_log_offset), "group": "G", "delayLevel": "-1"})
    assert env.call(send_back).code == C.SUCCESS   # creates %RETRY%G with 1 queue
    assert env.ctx.topics.get("%RETRY%G").write_queue_nums == 1
    changes = env.topic_changes
    env.call(update_cmd({"groupName": "G", "retryQueueNums": 4}))
    rtc = env.ctx.topics.get("%RETRY%G")
    assert (rtc.read_queue_nums, rtc.write_queue_nums) == (4, 4) and env.topic_changes == changes + 1
    for _ in range(64):
        cmd = RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
            "offset": str(msg.commit_log_offset), "group": "G", "delayLevel": "1"})
        assert env.call(cmd).code == C.SUCCESS
    got = env.store.get_message(SCHEDULE_TOPIC, 0, 0, 64)   # level 1 parks in queue 0
    assert {int(m.properties["REAL_QID"]) for m in decode_records(b"".join(got.buffers))} == {0, 1, 2, 3}
    # retryQueueNums 0: send-backs are accepted and dropped, as in Java
    env.call(update_cmd({"groupName": "G", "retryQueueNums": 0}))
    before = env.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 0)
    cmd = RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
        "offset": str(msg.commit_log_offset), "group": "G", "delayLevel": "1"})
    assert env.call(cmd).code == C.SUCCESS
    assert env.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 0) == before


def test_a_disabled_group_cannot_pull(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"x"))
    env.call(update_cmd({"groupName": "G", "consumeEnable": False}))
    r = env.call(pull_cmd("T", 0, 0))
    assert (r.code, r.remark) == (C.NO_PERMISSION, "subscription group no permission, G")
    env.call(update_cmd({"groupName": "G"}))
    assert env.call(pull_cmd("T", 0, 0)).code == C.SUCCESS


# -- mqadmin's flags ---------------------------------------------------------------------------

def parse(*argv):
    return build_parser(COMMANDS["updateSubGroup"]).parse_args(list(argv))


def test_update_sub_group_flags_are_javas():
    flags = {a.option_strings[0]: a.option_strings[1] for a in build_parser(COMMANDS["updateSubGroup"])._actions
             if len(a.option_strings) == 2 and a.option_strings[0] != "-h"}
    assert flags == {"-n": "--namesrvAddr", "-b": "--brokerAddr", "-c": "--clusterName", "-g": "--groupName",
                     "-s": "--consumeEnable", "-m": "--consumeFromMinEnable", "-d": "--consumeBroadcastEnable",
                     "-q": "--retryQueueNums", "-r": "--retryMaxTimes", "-i": "--brokerId",
                     "-w": "--whichBrokerWhenConsumeSlowly", "-a": "--notifyConsumerIdsChanged",
                     "-o": "--consumeOrderly"}
    delete = {a.option_strings[0] for a in build_parser(COMMANDS["deleteSubGroup"])._actions}
    assert delete == {"-h", "-n", "-b", "-c", "-g", "-r"}


def test_update_sub_group_sends_javas_config():
    # Java's command starts from false for broadcast and from-min, Java's defaults otherwise
    c = config_from_flags(parse("-b", "h:1", "-g", "G", "-r", "2"))
    assert c == SubscriptionGroupConfig("G", retryMaxTimes=2, consumeBroadcastEnable=False,
                                        consumeFromMinEnable=False)
    c = config_from_flags(parse("-c", "C", "-g", "G", "-s", "false", "-d", "TRUE", "-m", "true", "-q", "3",
                                "-i", "1", "-w", "2", "-a", "no"))
    assert c == SubscriptionGroupConfig("G", consumeEnable=False, consumeBroadcastEnable=True,
                                        consumeFromMinEnable=True, retryQueueNums=3, brokerId=1,
                                        whichBrokerWhenConsumeSlowly=2, notifyConsumerIdsChangedEnable=False)
    assert group_config_line(c) == (
        "SubscriptionGroupConfig [groupName=G, consumeEnable=false, consumeFromMinEnable=true, "
        "consumeBroadcastEnable=true, retryQueueNums=3, retryMaxTimes=16, brokerId=1, "
        "whichBrokerWhenConsumeSlowly=2, notifyConsumerIdsChangedEnable=false]")
    c = config_from_flags(parse("-b", "h:1", "-g", "G", "-o", "true"))
    assert c.consumeMessageOrderly and group_config_line(c).endswith(
        "notifyConsumerIdsChangedEnable=true, consumeMessageOrderly=true]")
    with pytest.raises((SystemExit, Exception)):
        parse("-g", "G", "-r", "-1")
    with pytest.raises((SystemExit, Exception)):
        parse("-g", "G", "-q", "x")
    assert isinstance(parse("-g", "G"), argparse.Namespace)


def test_a_broadcasting_group_without_consume_broadcast_enable_cannot_pull(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"x"))
    heartbeat = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "BROADCASTING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "T", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1,
                                 "expressionType": "TAG"}]}]}
    assert env.call(RemotingCommand(R.HEART_BEAT, body=dumps(heartbeat))).code == C.SUCCESS
    # a Java push consumer's pull: no subscription in it, the heartbeat's applies
    pull = RemotingCommand(R.PULL_MESSAGE, ext_fields={
        "consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0",
        "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "1"})
    assert env.call(pull).code == C.SUCCESS
    env.call(update_cmd({"groupName": "G", "consumeBroadcastEnable": False}))
    r = env.call(pull)
    assert (r.code, r.remark) == (C.NO_PERMISSION, "the consumer group[G] can not consume by broadcast way")
