"""Pure broker rules with an integer clock: registries, held pulls, locks, topics, offsets."""
from types import SimpleNamespace

from pocketmq.broker.core.clients import ClientChannelInfo, ConsumerManager, ProducerManager
from pocketmq.broker.core.held_pulls import HeldPull, HeldPullTable
from pocketmq.broker.core.locks import RebalanceLockManager
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager, validate_topic
from pocketmq.protocol.bodies import MessageQueue, build_subscription


def info(cid, now):
    return ClientChannelInfo(cid, 0, 401, "127.0.0.1:1", now)


def test_consumer_membership_changes_and_subscription_versions():
    m = ConsumerManager()
    s1 = build_subscription("T", "*", sub_version=1)
    assert m.register("G", "ch1", info("a", 0), "CONSUME_PASSIVELY", "CLUSTERING", "X", [s1], 0) is True
    # Same channel, same topics: no change (a mere heartbeat).
    assert m.register("G", "ch1", info("a", 10), "CONSUME_PASSIVELY", "CLUSTERING", "X", [s1], 10) is False
    # A newer subVersion replaces the entry without a membership change.
    s2 = build_subscription("T", "TagA", sub_version=2)
    assert m.register("G", "ch1", info("a", 20), "CONSUME_PASSIVELY", "CLUSTERING", "X", [s2], 20) is False
    assert m.find_subscription("G", "T").sub_string == "TagA"
    # An older one does not.
    assert m.register("G", "ch1", info("a", 30), "CONSUME_PASSIVELY", "CLUSTERING", "X",
                      [build_subscription("T", "*", sub_version=1)], 30) is False
    assert m.find_subscription("G", "T").sub_string == "TagA"
    # A new member or a topic-set change is a change.
    assert m.register("G", "ch2", info("b", 40), "CONSUME_PASSIVELY", "CLUSTERING", "X", [s2], 40) is True
    assert m.register("G", "ch2", info("b", 50), "CONSUME_PASSIVELY", "CLUSTERING", "X",
                      [s2, build_subscription("U", "*")], 50) is True
    assert sorted(m.get("G").client_ids()) == ["a", "b"]


def test_consumers_forgotten_on_close_and_after_120s_silence():
    m = ConsumerManager()
    s = [build_subscription("T", "*")]
    m.register("G", "ch1", info("a", 0), "CONSUME_PASSIVELY", "CLUSTERING", "X", s, 0)
    m.register("G", "ch2", info("b", 100_000), "CONSUME_PASSIVELY", "CLUSTERING", "X", s, 100_000)
    assert m.expire(120_000) == []               # exactly 120 s: still alive
    assert m.expire(120_001) == [("G", "ch1")]
    assert m.get("G").client_ids() == ["b"]
    assert m.remove_channel("ch2") == ["G"]
    assert m.get("G") is None


def test_producers_forgotten():
    p = ProducerManager()
    p.register("PG", "c1", info("a", 0))
    p.register("PG", "c2", info("b", 0))
    p.remove_channel("c1")
    assert list(p.groups["PG"]) == ["c2"]
    assert p.expire(200_000) == [("PG", "c2")] and p.groups == {}


def _held(topic, qid, offset, deadline, sub="*", conn="c"):
    h = SimpleNamespace(topic=topic, queue_id=qid)
    return HeldPull(conn, None, h, build_subscription(topic, sub), offset, deadline)


def test_held_pulls_wake_on_matching_tag_only():
    t = HeldPullTable()
    a = _held("T", 0, 5, 10_000, "TagA")
    b = _held("T", 0, 5, 10_000, "*")
    c = _held("T", 1, 5, 10_000, "*")
    for p in (a, b, c):
        assert t.hold(p)
    from pocketmq.protocol.message import tags_code
    assert t.notify("T", 0, 5, tags_code("TagA")) == []      # nothing past offset 5 yet
    assert t.notify("T", 0, 6, tags_code("TagB")) == [b]     # only the '*' pull matches TagB
    assert t.notify("T", 0, 7, tags_code("TagA")) == [a]
    assert t.count == 1 and t.held_on("T", 1) == [c] and t.held_on("T", 0) == []


def test_held_pulls_expire_in_deadline_order_and_bound():
    t = HeldPullTable(held_max=2)
    a, b = _held("T", 0, 0, 300), _held("T", 0, 0, 100)
    assert t.hold(a) and t.hold(b)
    assert not t.hold(_held("T", 0, 0, 50))                 # over the bound: refused
    assert t.next_deadline_ms() == 100
    assert t.expire(99) == []
    assert t.expire(100) == [b]
    assert t.next_deadline_ms() == 300
    assert t.stale(lambda topic, q: 1) == [a]                # safety-net rescan
    assert t.count == 0 and t.next_deadline_ms() is None


def test_held_pulls_dropped_with_their_connection():
    t = HeldPullTable()
    t.hold(_held("T", 0, 0, 100, conn="x"))
    t.hold(_held("T", 0, 0, 100, conn="y"))
    assert t.drop_connection("x") == 1 and t.count == 1


def test_queue_locks():
    lm = RebalanceLockManager(lock_max_live_ms=60_000)
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert lm.try_lock_batch("G", [q0, q1], "c1", 0) == {q0, q1}
    assert lm.try_lock_batch("G", [q0], "c2", 30_000) == set()      # held by c1
    assert lm.try_lock_batch("G", [q0], "c1", 50_000) == {q0}       # refresh
    assert lm.try_lock_batch("G", [q1], "c2", 60_001) == {q1}       # c1's q1 lock expired
    lm.unlock_batch("G", [q0], "c2")                                  # not c2's: no effect
    assert lm.is_locked("G", q0, "c1", 60_001)
    lm.unlock_batch("G", [q0], "c1")
    assert not lm.is_locked("G", q0, "c1", 60_001)


def test_topic_auto_creation_rules():
    tm = TopicConfigManager(cluster_name="C", broker_name="b", auto_create_topic_enable=True,
                            default_topic_queue_nums=8)
    v0 = tm.data_version.counter
    tc = tm.create_from_default("New", "TBW102", 4, 1000)
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
    assert tm.data_version.counter == v0 + 1
    assert tm.create_from_default("Other", "NoSuchDefault", 4, 1000) is None
    assert tm.create_from_default("%RETRY%g", "NoSuchDefault", 4, 1000).read_queue_nums == 1
    off = TopicConfigManager(cluster_name="C", broker_name="b", auto_create_topic_enable=False,
                             default_topic_queue_nums=8)
    assert off.create_from_default("New", "TBW102", 4, 1) is None
    assert tm.is_system_topic("SCHEDULE_TOPIC_XXXX") and tm.is_system_topic("rmq_sys_x")
    again = TopicConfigManager(cluster_name="C", broker_name="b", auto_create_topic_enable=True,
                               default_topic_queue_nums=8)
    again.load(tm.encode())
    assert again.get("New").write_queue_nums == 4 and again.data_version == tm.data_version


def test_topic_name_validation():
    assert validate_topic("Good_Topic-1%|") is None
    for bad in ("", "  ", "bad topic", "x" * 128, "中文"):
        assert validate_topic(bad)


def test_offsets_persist_round_trip_and_read_java_form():
    o = ConsumerOffsetManager()
    o.commit("G", "T", 0, 5)
    o.commit("G", "T", 3, 9)
    p = ConsumerOffsetManager()
    p.load(o.encode())
    assert p.query("G", "T", 3) == 9 and p.query("G", "T", 1) == -1
    java = b'{\n\t"offsetTable":{\n\t\t"T1@G1":{0:250,1:250\n\t\t}\n\t}\n}'
    q = ConsumerOffsetManager()
    q.load(java)
    assert q.query("G1", "T1", 1) == 250
    assert q.topics_of_group("G1") == {"T1"} and q.groups_of_topic("T1") == {"G1"}


def test_subscription_groups_auto_create_and_persist():
    g = SubscriptionGroupManager(auto_create=True)
    assert g.find("G", 5).retryMaxTimes == 16 and g.dirty
    h = SubscriptionGroupManager(auto_create=False)
    assert h.find("G") is None
    h.load(g.encode())
    assert h.find("G").groupName == "G"


def test_reset_table_rule():
    from pocketmq.broker.core.offsets import reset_table
    by_time = {0: 5, 1: 5, 2: 5, 3: -1}
    committed = {0: 3, 1: 9, 3: 4}          # queue 2 never committed
    assert reset_table(committed, by_time, force=True) == {0: 5, 1: 5, 2: 5, 3: 0}
    # without force only backwards (and a queue without an offset takes the time's)
    assert reset_table(committed, by_time, force=False) == {0: 3, 1: 5, 2: 5, 3: 0}


def test_broker_core_is_pure_and_the_shells_know_their_place():
    """broker/core: no I/O, no clock (now_ms is an argument). Services get what they call
    injected (no processor import); processors never reach back into the composition root."""
    import ast
    import pathlib
    import pocketmq.broker as broker_pkg
    root = pathlib.Path(broker_pkg.__path__[0])
    forbidden = {
        "core": {"asyncio", "socket", "time", "os", "threading", "selectors", "uvloop",
                 "pocketmq.remoting", "pocketmq.broker.app", "pocketmq.broker.processors",
                 "pocketmq.broker.services"},
        "services": {"pocketmq.broker.processors", "pocketmq.broker.app"},
        "processors": {"pocketmq.broker.app", "pocketmq.broker.services"},
    }
    problems = []
    for folder, banned in forbidden.items():
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    if any(name == b or name.startswith(b + ".") for b in banned):
                        problems.append(f"{folder}/{path.name}:{node.lineno} imports {name}")
    assert not problems, problems
