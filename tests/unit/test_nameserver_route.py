"""RouteInfoManager and KVConfig driven with an integer clock (no sockets, no sleeps)."""
from __future__ import annotations

import pytest

from pocketmq.nameserver.route import (BROKER_CHANNEL_EXPIRED_MS, KVConfig, RouteInfoManager, RouteTableFull)
from pocketmq.protocol.bodies import DataVersion, TopicConfig, TopicRouteData, dumps, loads
from pocketmq.protocol.codes import PermName
from pocketmq.protocol.errors import BodyError

CLUSTER = "DefaultCluster"
A0 = "10.0.0.1:10911"   # broker-a master
A1 = "10.0.0.2:10911"   # broker-a slave
B0 = "10.0.0.3:10911"   # broker-b master


def topics(*names, queues=4, perm=6, sys_flag=0):
    return {n: TopicConfig(n, queues, queues, perm, topic_sys_flag=sys_flag) for n in names}


def reg(rim, addr, name, bid, tops, version=DataVersion(1, 1), channel=None, now=0, cluster=CLUSTER):
    return rim.register_broker(cluster, addr, name, bid, addr.replace("10911", "10912"), tops, version,
                               channel if channel is not None else addr, now)


def test_register_master_then_route():
    rim = RouteInfoManager()
    result = reg(rim, A0, "broker-a", 0, topics("T1", "TBW102"))
    assert result == (None, None)
    route = rim.get_route("T1")
    assert isinstance(route, TopicRouteData)
    assert [q.broker_name for q in route.queue_datas] == ["broker-a"]
    q = route.queue_datas[0]
    assert (q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag) == (4, 4, 6, 0)
    assert [(b.cluster, b.broker_name, b.broker_addrs) for b in route.broker_datas] == \
        [(CLUSTER, "broker-a", {0: A0})]
    assert rim.get_route("TBW102") is not None
    assert rim.get_route("nope") is None
    # Wire form: quoted numeric keys, compact.
    body = dumps(route.to_json())
    assert b'"brokerAddrs":{"0":"10.0.0.1:10911"}' in body
    assert TopicRouteData.from_body(body).broker_datas[0].broker_addrs == {0: A0}


def test_route_copies_do_not_alias_the_table():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"))
    route = rim.get_route("T1")
    route.queue_datas[0].perm = 0
    route.broker_datas[0].broker_addrs[5] = "x:1"
    again = rim.get_route("T1")
    assert again.queue_datas[0].perm == 6
    assert again.broker_datas[0].broker_addrs == {0: A0}


def test_data_version_rules_for_master_queue_data():
    rim = RouteInfoManager()
    v1, v2 = DataVersion(100, 1), DataVersion(200, 2)
    reg(rim, A0, "broker-a", 0, topics("T1", queues=4), v1, now=0)
    # Same DataVersion, different body: ignored (Java only re-reads topics on a version change).
    reg(rim, A0, "broker-a", 0, topics("T1", "T2", queues=8), v1, now=1000)
    assert rim.get_route("T1").queue_datas[0].write_queue_nums == 4
    assert rim.get_route("T2") is None
    # New DataVersion: queue data created or replaced.
    reg(rim, A0, "broker-a", 0, topics("T1", "T2", queues=8), v2, now=2000)
    assert rim.get_route("T1").queue_datas[0].write_queue_nums == 8
    assert rim.get_route("T2").queue_datas[0].write_queue_nums == 8
    # Topics missing from a later registration stay (Java 4.9 never removes them here).
    reg(rim, A0, "broker-a", 0, topics("T2"), DataVersion(300, 3), now=3000)
    assert rim.get_route("T1") is not None
    assert rim.query_broker_topic_config(A0) == DataVersion(300, 3)


def test_first_registration_of_an_id_always_writes_queue_data():
    rim = RouteInfoManager()
    v = DataVersion(5, 5)
    reg(rim, A0, "broker-a", 0, topics("T1"), v)
    rim.delete_topic("T1")
    # Unregister then register again with the same version: first registration again.
    rim.unregister_broker(CLUSTER, A0, "broker-a", 0)
    reg(rim, A0, "broker-a", 0, topics("T1"), v)
    assert rim.get_route("T1") is not None


def test_slave_gets_master_addresses_and_does_not_write_queue_data():
    rim = RouteInfoManager()
    # Slave before master: nothing to learn, no queue data (only masters write it).
    assert reg(rim, A1, "broker-a", 1, topics("T1")) == (None, None)
    assert rim.get_route("T1") is None
    reg(rim, A0, "broker-a", 0, topics("T1"))
    result = reg(rim, A1, "broker-a", 1, topics("T1"), now=10)
    assert result.master_addr == A0
    assert result.ha_server_addr == "10.0.0.1:10912"
    assert rim.get_route("T1").broker_datas[0].broker_addrs == {0: A0, 1: A1}


def test_same_address_under_another_id_is_replaced():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"))
    reg(rim, A1, "broker-a", 1, topics("T1"))
    # The slave at A1 is promoted to master (id 0): A1 leaves id 1, takes id 0.
    reg(rim, A1, "broker-a", 0, topics("T1"), DataVersion(9, 9))
    assert rim.get_route("T1").broker_datas[0].broker_addrs == {0: A1}


def test_expiry_at_120_seconds():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"), now=1_000)
    reg(rim, B0, "broker-b", 0, topics("T1"), now=60_000)
    assert rim.next_deadline_ms() == 1_000 + BROKER_CHANNEL_EXPIRED_MS + 1
    # Exactly 120 s silent: still alive (Java compares last + 120000 < now).
    assert rim.expire(1_000 + BROKER_CHANNEL_EXPIRED_MS) == []
    removed = rim.expire(1_000 + BROKER_CHANNEL_EXPIRED_MS + 1)
    assert [(r.broker_addr, r.channel_key, r.broker_names_removed) for r in removed] == \
        [(A0, A0, ("broker-a",))]
    route = rim.get_route("T1")
    assert [q.broker_name for q in route.queue_datas] == ["broker-b"]
    # A re-registration refreshes the timestamp.
    reg(rim, B0, "broker-b", 0, topics("T1"), now=170_000)
    assert rim.expire(250_000) == []
    assert [r.broker_addr for r in rim.expire(290_001)] == [B0]
    assert rim.get_route("T1") is None
    assert rim.all_topics() == []
    assert rim.cluster_info() == ({}, {})
    assert rim.next_deadline_ms() is None


def test_query_data_version_refreshes_liveness_only_when_unchanged():
    rim = RouteInfoManager()
    v = DataVersion(7, 3)
    reg(rim, A0, "broker-a", 0, topics("T1"), v, now=0)
    assert rim.query_data_version(A0, DataVersion(7, 4), 100_000) == (True, v)
    assert rim.broker_live(A0).last_update_ms == 0
    assert rim.query_data_version(A0, DataVersion(7, 3), 100_000) == (False, v)
    assert rim.expire(200_000) == []
    assert rim.query_data_version("nobody:1", v, 0) == (True, None)


def test_channel_close_removes_only_that_channels_brokers():
    rim = RouteInfoManager()
    chan_a, chan_b = object(), object()
    reg(rim, A0, "broker-a", 0, topics("T1", "TA"), channel=chan_a)
    reg(rim, B0, "broker-b", 0, topics("T1"), channel=chan_b)
    assert rim.remove_by_channel(object()) == []
    removed = rim.remove_by_channel(chan_a)
    assert [(r.broker_addr, r.channel_key) for r in removed] == [(A0, chan_a)]
    assert rim.get_route("TA") is None
    assert [b.broker_name for b in rim.get_route("T1").broker_datas] == ["broker-b"]
    assert rim.cluster_info()[1] == {CLUSTER: ["broker-b"]}


def test_master_queue_data_kept_while_slave_alive():
    rim = RouteInfoManager()
    chan_m, chan_s = object(), object()
    reg(rim, A0, "broker-a", 0, topics("T1"), channel=chan_m)
    reg(rim, A1, "broker-a", 1, topics("T1"), channel=chan_s)
    removed = rim.remove_by_channel(chan_m)
    assert removed[0].broker_names_removed == ()
    route = rim.get_route("T1")
    assert route.broker_datas[0].broker_addrs == {1: A1}   # no master: producers skip it
    assert route.queue_datas[0].broker_name == "broker-a"


def test_route_needs_both_queue_data_and_broker_data():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"))
    # Queue data whose broker data vanished (inconsistent table) -> no route.
    del rim.broker_addr_table["broker-a"]
    assert rim.get_route("T1") is None
    # Broker data without queue data for the topic -> no route.
    rim2 = RouteInfoManager()
    reg(rim2, A0, "broker-a", 0, {})
    assert rim2.get_route("T1") is None
    assert rim2.cluster_info()[0]["broker-a"].broker_addrs == {0: A0}


def test_unregister_broker():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"))
    reg(rim, A1, "broker-a", 1, topics("T1"))
    assert rim.unregister_broker(CLUSTER, A1, "broker-a", 1) is False
    assert rim.get_route("T1").broker_datas[0].broker_addrs == {0: A0}
    assert rim.unregister_broker(CLUSTER, A0, "broker-a", 0) is True
    assert rim.get_route("T1") is None
    assert rim.cluster_info() == ({}, {})
    assert rim.broker_live(A0) is None
    # Unknown broker: harmless.
    assert rim.unregister_broker(CLUSTER, "x:1", "ghost", 0) is False


def test_a_demoted_master_unregistering_keeps_the_new_masters_entry():
    # failover: the slave A1 became brokerId 0; the old master A0 closes and unregisters id 0
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1"))
    reg(rim, A1, "broker-a", 1, topics("T1"))
    reg(rim, A1, "broker-a", 0, topics("T1"))
    assert rim.get_route("T1").broker_datas[0].broker_addrs == {0: A1}
    assert rim.unregister_broker(CLUSTER, A0, "broker-a", 0) is False
    assert rim.get_route("T1").broker_datas[0].broker_addrs == {0: A1}


def test_delete_topic_whole_and_per_cluster():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1", "T2"), cluster="C1")
    reg(rim, B0, "broker-b", 0, topics("T1", "T2"), cluster="C2")
    assert rim.delete_topic("T1") is True
    assert rim.get_route("T1") is None
    assert rim.delete_topic("T1") is False
    assert rim.delete_topic("T2", "C1") is True
    assert [q.broker_name for q in rim.get_route("T2").queue_datas] == ["broker-b"]
    assert rim.delete_topic("T2", "nope") is False
    assert rim.delete_topic("T2", "C2") is True
    assert rim.all_topics() == []


def test_wipe_and_add_write_perm():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1", "T2"))
    reg(rim, B0, "broker-b", 0, topics("T1"))
    assert rim.wipe_write_perm_of_broker("broker-a") == 2
    perms = {q.broker_name: q.perm for q in rim.get_route("T1").queue_datas}
    assert perms == {"broker-a": PermName.READ, "broker-b": 6}
    assert rim.wipe_write_perm_of_broker("ghost") == 0
    assert rim.add_write_perm_of_broker("broker-a") == 2
    assert rim.get_route("T2").queue_datas[0].perm == PermName.READ | PermName.WRITE


def test_topic_lists_and_cluster_info():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1", "TBW102"), cluster="C1")
    reg(rim, B0, "broker-b", 0, topics("T2"), cluster="C2")
    assert rim.all_topics() == ["T1", "T2", "TBW102"]
    assert rim.topics_by_cluster("C1") == ["T1", "TBW102"]
    assert rim.topics_by_cluster("C2") == ["T2"]
    assert rim.topics_by_cluster("none") == []
    system, addr = rim.system_topic_list()
    assert system == ["C1", "broker-a", "C2", "broker-b"]
    assert addr == A0
    brokers, clusters = rim.cluster_info()
    assert clusters == {"C1": ["broker-a"], "C2": ["broker-b"]}
    assert brokers["broker-b"].broker_addrs == {0: B0}


def test_topic_sys_flag_and_perm_come_from_topic_config():
    rim = RouteInfoManager()
    reg(rim, A0, "broker-a", 0, topics("T1", perm=4, sys_flag=1))
    q = rim.get_route("T1").queue_datas[0]
    assert (q.perm, q.topic_sys_flag) == (4, 1)


def test_bounds_refuse_and_leave_table_unchanged():
    rim = RouteInfoManager(brokers_max=1, topics_max=2)
    reg(rim, A0, "broker-a", 0, topics("T1"))
    with pytest.raises(RouteTableFull):
        reg(rim, B0, "broker-b", 0, topics("T1"))
    with pytest.raises(RouteTableFull):
        reg(rim, A0, "broker-a", 0, topics("T1", "T2", "T3"), DataVersion(2, 2))
    assert rim.all_topics() == ["T1"]
    assert set(rim.cluster_info()[0]) == {"broker-a"}
    reg(rim, A0, "broker-a", 0, topics("T1", "T2"), DataVersion(2, 2))   # within bounds
    assert rim.all_topics() == ["T1", "T2"]


# -- KVConfig ------------------------------------------------------------------------------

def test_kv_config_round_trip_and_version():
    kv = KVConfig()
    assert kv.get("ns", "k") is None
    kv.put("ORDER_TOPIC_CONFIG", "T1", "broker-a:8;broker-b:8")
    kv.put("ns", "k", "v")
    assert kv.version == 2
    assert kv.get("ns", "k") == "v"
    assert kv.list_namespace("ns") == {"k": "v"}
    assert kv.list_namespace("none") is None
    assert kv.delete("ns", "missing") is False
    assert kv.delete("ns", "k") is True
    assert kv.list_namespace("ns") == {}
    data = kv.to_json_bytes()
    assert loads(data) == {"configTable": {"ORDER_TOPIC_CONFIG": {"T1": "broker-a:8;broker-b:8"}, "ns": {}}}
    kv2 = KVConfig.from_json_bytes(data)
    assert kv2.config_table == kv.config_table and kv2.version == 0


def test_kv_config_reads_java_file_and_rejects_garbage():
    java = b'{\n\t"configTable":{\n\t\t"ORDER_TOPIC_CONFIG":{\n\t\t\t"T1":"broker-a:4"\n\t\t}\n\t}\n}'
    assert KVConfig.from_json_bytes(java).get("ORDER_TOPIC_CONFIG", "T1") == "broker-a:4"
    assert KVConfig.from_json_bytes(b"").config_table == {}
    for bad in (b"[1,2]", b'{"configTable":{"ns":3}}', b"{not json"):
        with pytest.raises(BodyError):
            KVConfig.from_json_bytes(bad)


def test_kv_config_bounds():
    kv = KVConfig(namespaces_max=1, keys_per_namespace_max=1, item_bytes_max=4)
    kv.put("ns", "k", "v")
    with pytest.raises(ValueError):
        kv.put("ns2", "k", "v")
    with pytest.raises(ValueError):
        kv.put("ns", "k2", "v")
    with pytest.raises(ValueError):
        kv.put("ns", "k", "12345")
    kv.put("ns", "k", "1234")   # replacing an existing key is within bounds
    assert kv.get("ns", "k") == "1234"
