"""Replication's metadata rules (broker/core/metadata_sync.py), the offset-table codecs
(protocol/bodies.py) and ScheduleCursors.adopt: what a slave takes from its master's
answers, what a returning master takes back, in both Java's and pocketmq's JSON forms."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from pocketmq.broker.core.delay import ScheduleCursors
from pocketmq.broker.core.metadata_sync import (SyncLog, adopt_groups, adopt_offsets, adopt_topics, group_slaves,
                                                take_back)
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.protocol.bodies import decode_consumer_offset_wrapper
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.broker.processors.admin import (
    process_get_all_consumer_offset,
    process_get_all_delay_offset,
    process_get_all_subscription_group,
    process_get_all_topic_config,
)
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import BrokerData, DataVersion, SubscriptionGroupConfig, TopicConfig
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError


def topic_manager() -> TopicConfigManager:
    return TopicConfigManager(cluster_name="C", broker_name="b", auto_create_topic_enable=True,
                              default_topic_queue_nums=4)


def master_tables():
    """A master with a topic, a group, offsets and delay cursors, and its four answers."""
    topics = topic_manager()
    topics.update(TopicConfig("TM", 8, 8, 6), now_ms=1000)
    groups = SubscriptionGroupManager()
    groups.update(SubscriptionGroupConfig("GM", retryMaxTimes=3), now_ms=1000)
    offsets = ConsumerOffsetManager()
    offsets.commit("GM", "TM", 0, 42)
    offsets.commit("GM", "TM", 1, 7)
    cursors = ScheduleCursors()
    cursors.advance(1, 5)
    cursors.advance(3, 9)
    ctx = SimpleNamespace(topics=topics, groups=groups, offsets=offsets, schedule_cursors=cursors)
    answers = {code: fn(ctx, None, RemotingCommand(code)) for code, fn in (
        (RequestCode.GET_ALL_TOPIC_CONFIG, process_get_all_topic_config),
        (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, process_get_all_subscription_group),
        (RequestCode.GET_ALL_CONSUMER_OFFSET, process_get_all_consumer_offset),
        (RequestCode.GET_ALL_DELAY_OFFSET, process_get_all_delay_offset))}
    assert all(r.code == ResponseCode.SUCCESS for r in answers.values())
    return ctx, {code: r.body_bytes() for code, r in answers.items()}


# -- what our master serves is Java's wrappers ----------------------------------------------------

def test_master_bodies_have_javas_wrapper_members():
    _, body = master_tables()
    topics = json.loads(body[RequestCode.GET_ALL_TOPIC_CONFIG])
    assert set(topics) == {"topicConfigTable", "dataVersion"}          # TopicConfigSerializeWrapper
    assert set(topics["topicConfigTable"]["TM"]) == {"topicName", "readQueueNums", "writeQueueNums", "perm",
                                                      "topicFilterType", "topicSysFlag", "order"}
    assert set(topics["dataVersion"]) == {"timestamp", "counter"}
    groups = json.loads(body[RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG])
    assert set(groups) == {"subscriptionGroupTable", "dataVersion"}    # SubscriptionGroupWrapper
    assert groups["subscriptionGroupTable"]["GM"]["retryMaxTimes"] == 3
    # ConsumerOffsetSerializeWrapper and DelayOffsetSerializeWrapper; quoted integer keys,
    # which fastjson reads into its Integer keys
    assert json.loads(body[RequestCode.GET_ALL_CONSUMER_OFFSET]) == {"offsetTable": {"TM@GM": {"0": 42, "1": 7}}}
    assert json.loads(body[RequestCode.GET_ALL_DELAY_OFFSET]) == {"offsetTable": {"1": 5, "3": 9}}


def test_delay_offsets_without_cursors_are_refused_as_java_does():
    r = process_get_all_delay_offset(SimpleNamespace(schedule_cursors=None), None,
                                     RemotingCommand(RequestCode.GET_ALL_DELAY_OFFSET))
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "No delay offset in this broker"


# -- a slave adopts a pocketmq master's answers -----------------------------------------------------

def test_slave_takes_everything_from_a_pocketmq_master():
    master, body = master_tables()
    topics, groups, offsets, cursors = topic_manager(), SubscriptionGroupManager(), ConsumerOffsetManager(), \
        ScheduleCursors()
    topics.update(TopicConfig("ONLY_ON_SLAVE", 1, 1, 6), now_ms=5)
    groups.update(SubscriptionGroupConfig("G_SLAVE"), now_ms=5)
    offsets.commit("GS", "TS", 0, 3)          # a key only the slave has stays
    offsets.commit("GM", "TM", 2, 99)         # the master's key replaces the slave's queues
    assert adopt_topics(topics, body[RequestCode.GET_ALL_TOPIC_CONFIG])
    assert topics.topics == master.topics.topics and topics.data_version == master.topics.data_version
    assert "ONLY_ON_SLAVE" not in topics.topics
    assert adopt_groups(groups, body[RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG]) and groups.dirty
    assert groups.table == master.groups.table and groups.data_version == master.groups.data_version
    assert adopt_offsets(offsets, body[RequestCode.GET_ALL_CONSUMER_OFFSET]) == 1 and offsets.dirty
    assert offsets.table == {"TS@GS": {0: 3}, "TM@GM": {0: 42, 1: 7}}
    assert cursors.adopt(body[RequestCode.GET_ALL_DELAY_OFFSET]) and cursors.dirty
    assert cursors.offsets == {1: 5, 3: 9} and cursors.get(3) == 9
    # a second round with the same answers changes nothing
    groups.dirty = offsets.dirty = cursors.dirty = False
    assert not adopt_topics(topics, body[RequestCode.GET_ALL_TOPIC_CONFIG])
    assert not adopt_groups(groups, body[RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG])
    assert adopt_offsets(offsets, body[RequestCode.GET_ALL_CONSUMER_OFFSET]) == 0
    assert not cursors.adopt(body[RequestCode.GET_ALL_DELAY_OFFSET])
    assert not (groups.dirty or offsets.dirty or cursors.dirty)


def test_same_data_version_keeps_the_slaves_table():
    topics = topic_manager()
    topics.data_version = DataVersion(7, 3)
    body = bodies.dumps(bodies.encode_topic_config_wrapper({"X": TopicConfig("X")}, DataVersion(7, 3)))
    assert not adopt_topics(topics, body)
    assert "X" not in topics.topics


# -- a Java master's answers (fastjson: bare integer keys, newer members) ---------------------------

JAVA_TOPICS = (b'{"dataVersion":{"counter":4,"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":{'
               b'"TJ":{"attributes":{},"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
               b'"topicName":"TJ","topicSysFlag":0,"writeQueueNums":4}}}')
JAVA_GROUPS = (b'{"dataVersion":{"counter":2,"timestamp":1700000000001},"subscriptionGroupTable":{"GJ":{'
               b'"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,"consumeFromMinEnable":true,'
               b'"consumeMessageOrderly":false,"consumeTimeoutMinute":15,"groupName":"GJ",'
               b'"groupRetryPolicy":{"type":"CUSTOMIZED"},"notifyConsumerIdsChangedEnable":true,'
               b'"retryMaxTimes":16,"retryQueueNums":1,"whichBrokerWhenConsumeSlowly":1}}}')
JAVA_OFFSETS = (b'{"dataVersion":{"counter":1,"timestamp":1},'
                b'"offsetTable":{"TJ@GJ":{0:12,1:250\n\t\t},"%RETRY%GJ@GJ":{0:0}}}')
JAVA_DELAY = b'{"offsetTable":{1:17,2:0,18:4}}'


def test_slave_parses_a_java_masters_answers():
    topics, groups, offsets, cursors = topic_manager(), SubscriptionGroupManager(), ConsumerOffsetManager(), \
        ScheduleCursors()
    assert adopt_topics(topics, JAVA_TOPICS)
    assert topics.topics == {"TJ": TopicConfig("TJ", 4, 4, 6)} and topics.data_version == DataVersion(1700000000000, 4)
    assert adopt_groups(groups, JAVA_GROUPS) and groups.table["GJ"] == SubscriptionGroupConfig("GJ")
    assert adopt_offsets(offsets, JAVA_OFFSETS) == 2
    assert offsets.table == {"TJ@GJ": {0: 12, 1: 250}, "%RETRY%GJ@GJ": {0: 0}}
    assert cursors.adopt(JAVA_DELAY) and cursors.offsets == {1: 17, 2: 0, 18: 4}


def test_a_minus_one_offset_means_none_and_never_lowers_an_offset():
    """-1 is what a broker stores when a client (ali-ons) commits it for a queue it holds no
    position in: such an entry is no offset; the rest of the table is taken."""
    offsets = ConsumerOffsetManager()
    offsets.commit("G", "T", 0, 5)
    assert take_back(offsets, decode_consumer_offset_wrapper(b'{"offsetTable":{"T@G":{"0":-1,"1":9}}}')) \
        == {("T@G", 1)}
    assert offsets.table == {"T@G": {0: 5, 1: 9}}
    slave = ConsumerOffsetManager()
    assert adopt_offsets(slave, b'{"offsetTable":{"T@G":{"0":-1,"1":7}}}') == 1
    assert slave.table == {"T@G": {1: 7}}


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"offsetTable":[]}', b'{"offsetTable":{"T":{"0":1}}}',
                                  b'{"offsetTable":{"T@G":{"x":1}}}', b'{"offsetTable":{"T@G":{"0":true}}}', b'{"offsetTable":{"T@G":[1]}}',
                                  b'{"offsetTable":{"bad topic@G":{"0":1}}}'])
def test_a_bad_offset_body_changes_nothing(body):
    offsets = ConsumerOffsetManager()
    offsets.commit("G", "T", 0, 5)
    with pytest.raises(BodyError):
        adopt_offsets(offsets, body)
    assert offsets.table == {"T@G": {0: 5}} and offsets.dirty   # dirty from the commit only


@pytest.mark.parametrize("body", [b"nope", b'{"offsetTable":{"0":1}}', b'{"offsetTable":{"1":"x"}}',
                                  b'{"offsetTable":{"1":-2}}', b'{"offsetTable":5}'])
def test_a_bad_delay_body_changes_nothing(body):
    cursors = ScheduleCursors()
    cursors.advance(2, 8)
    cursors.dirty = False
    with pytest.raises(BodyError):
        cursors.adopt(body)
    assert cursors.offsets == {2: 8} and not cursors.dirty


@pytest.mark.parametrize("body", [b"garbage", b'{"topicConfigTable":{"bad name!":{"topicName":"bad name!"}}}',
                                  b'{"topicConfigTable":[]}', b'{"dataVersion":{"counter":9,"timestamp":9}}'])
def test_a_bad_topic_body_changes_nothing(body):
    topics = topic_manager()
    before = dict(topics.topics)
    with pytest.raises(BodyError):
        adopt_topics(topics, body)
    assert topics.topics == before


def test_a_bad_group_body_changes_nothing():
    groups = SubscriptionGroupManager()
    groups.update(SubscriptionGroupConfig("G"), now_ms=1)
    with pytest.raises(BodyError):
        adopt_groups(groups, b'{"subscriptionGroupTable":{"G2":{"groupName":"G2","retryMaxTimes":"many"}}}')
    assert list(groups.table) == ["G"]


# -- a returning master takes newer offsets back --------------------------------------------------

def test_take_back_keeps_the_larger_offset_per_queue():
    master = ConsumerOffsetManager()
    master.commit("G", "T", 0, 100)
    master.commit("G", "T", 1, 10)
    master.dirty = False
    slave_a = {"T@G": {0: 40, 1: 25, 2: 7}, "U@G": {0: 3}}       # q0 older, q1 newer, q2 and U new
    slave_b = {"T@G": {1: 30}}                                  # q1 newer still
    moved = take_back(master, slave_a) | take_back(master, slave_b)
    assert master.table == {"T@G": {0: 100, 1: 30, 2: 7}, "U@G": {0: 3}}
    assert moved == {("T@G", 1), ("T@G", 2), ("U@G", 0)} and master.dirty


def test_take_back_of_an_older_table_moves_nothing():
    master = ConsumerOffsetManager()
    master.commit("G", "T", 0, 100)
    master.dirty = False
    assert take_back(master, {"T@G": {0: 100}}) == set() and not master.dirty
    assert master.query("G", "T", 0) == 100


def test_group_slaves_from_cluster_info():
    body = bodies.encode_cluster_info(
        {"b": BrokerData("C", "b", {0: "m:1", 2: "s2:1", 1: "s1:1", 3: "me:1"}),
         "other": BrokerData("C", "other", {1: "x:1"})}, {"C": ["b", "other"]})
    assert group_slaves(body, "b", "me:1") == ["s1:1", "s2:1"]
    assert group_slaves(body, "nobody", "me:1") == []
    with pytest.raises(BodyError):
        group_slaves(b'{"brokerAddrTable":[1]}', "b", "me:1")
    with pytest.raises(BodyError):
        group_slaves(b'{"brokerAddrTable":{"b":{"brokerAddrs":{"x":"a:1"}}}}', "b", "me:1")


# -- which failures are logged --------------------------------------------------------------------

def test_sync_log_logs_changes_reminders_and_the_recovery_only():
    sl = SyncLog("sync", remind_ms=60_000)
    down = {item: "ConnectionClosed: cannot connect to m:1: refused" for item in ("topics", "groups")}
    assert sl.round("m:1", {}, 0) is None                         # all well, nothing to say
    level, text = sl.round("m:1", down, 1000)
    assert level == logging.WARNING and "failed" in text and sl.failing
    assert "groups, topics: ConnectionClosed: cannot connect to m:1" in text and text.count("cannot connect") == 1
    assert all(sl.round("m:1", down, t) is None for t in range(2000, 60_000, 10_000))   # every 10 s: silent
    level, text = sl.round("m:1", down, 61_000)
    assert level == logging.WARNING and "still failing after 60 s" in text
    assert sl.round("m:1", down, 71_000) is None
    # another kind of error, or another item failing, is worth a line
    level, text = sl.round("m:1", {"topics": "RequestTimeout: no answer in 3 s"}, 81_000)
    assert level == logging.WARNING and "now fails" in text and "RequestTimeout" in text
    assert sl.round("m:1", {"topics": "RequestTimeout: no answer in 3.0 s"}, 91_000) is None
    level, text = sl.round("m:1", {}, 101_000)
    assert level == logging.INFO and "works again after 100 s" in text and not sl.failing
    assert sl.round("m:1", {}, 111_000) is None
