"""The blocking facade: same names, own loop in a thread."""
import threading
import time

import pytest

from pocketmq.client import Message
from pocketmq.client.errors import ClientStateError
from pocketmq.client.sync import LitePullConsumer, Producer, PushConsumer, run
from tests.support.fake_broker import FakeCluster


@pytest.fixture
def cluster():
    c = FakeCluster()
    c.create_topic("T", 2)
    run(c.start(), 10)
    yield c
    run(c.close(), 10)


def test_sync_producer_push_and_lite(cluster):
    with Producer("PG", cluster.namesrv_addr, instance_name="s1") as p:
        results = [p.send(Message("T", f"m{i}".encode(), tags="X")) for i in range(10)]
        assert all(r.ok for r in results)
        assert len(p.send_batch([Message("T", b"b1"), Message("T", b"b2")])) == 1
        p.send_oneway(Message("T", b"one"))

    got = []
    lock = threading.Lock()
    all_in = threading.Event()

    def listener(msg):
        with lock:
            got.append(msg.body)
            if len(got) >= 13:
                all_in.set()

    c = PushConsumer("SG", cluster.namesrv_addr, listener=listener, instance_name="s2",
                     consume_from_where="FIRST_OFFSET")
    c.subscribe("T")
    with c:
        assert all_in.wait(10)
    assert len(set(got)) == 13

    lite = LitePullConsumer("SL", cluster.namesrv_addr, instance_name="s3", consume_from_where="FIRST_OFFSET")
    lite.subscribe("T")
    with lite:
        seen = []
        end = time.monotonic() + 10
        while len(seen) < 13 and time.monotonic() < end:
            seen.extend(lite.poll(0.5))
        assert len(seen) == 13
        mq = seen[0].queue
        lite.seek(mq, 0)
        assert lite.poll(5)[0].queue_offset == 0
        lite.commit()
        assert lite.committed(mq) >= 1


def test_calling_the_facade_from_its_own_loop_is_refused(cluster):
    async def inner():
        run(cluster.close())
    with pytest.raises(ClientStateError):
        run(inner(), 5)


def test_facade_works_in_a_forked_child():
    """The child inherits the facade's loop object but not its thread."""
    import os
    from pocketmq.client import sync

    async def forty_two():
        return 42
    assert sync.run(forty_two(), 5) == 42          # the parent's loop thread exists now
    pid = os.fork()
    if pid == 0:
        try:
            ok = sync.run(forty_two(), 5) == 42
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_close_from_inside_a_plain_listener_returns_and_loses_nothing(cluster):
    """close() called by the listener itself: the drain must wait for that very listener, so
    the call starts it and returns; the consumer then commits the listener's message too."""
    with Producer("PG", cluster.namesrv_addr, instance_name="s4") as p:
        for i in range(20):
            p.send(Message("T", f"c{i}".encode()))
    got, close_took = [], []
    done = threading.Event()

    def listener(msg):
        got.append(msg.body)
        if len(got) == 5:
            t = time.monotonic()
            c.close()
            close_took.append(time.monotonic() - t)
            done.set()

    c = PushConsumer("SC", cluster.namesrv_addr, listener=listener, instance_name="s5",
                     consume_from_where="FIRST_OFFSET", consume_concurrency=1, pull_batch_size=1)
    c.subscribe("T")
    c.start()
    assert done.wait(10)
    assert close_took[0] < 1.0
    c.close()          # from outside: waits for the drain the listener started
    assert c.impl.state == "CLOSED"
    first = list(got)
    again = []
    rest_in = threading.Event()
    if len(first) >= 20:
        # the drain may consume every cached message: with pulls quick enough that is all 20
        rest_in.set()

    def listener2(m):
        again.append(m.body)
        if len(first) + len(again) >= 20:
            rest_in.set()
    c2 = PushConsumer("SC", cluster.namesrv_addr, listener=listener2, instance_name="s6",
                      consume_from_where="FIRST_OFFSET")
    c2.subscribe("T")
    broker = cluster.brokers[0]
    with c2:
        assert rest_in.wait(10)
        # nothing more to come (a duplicate would already be pulled); close consumes the cache
        run(broker.until(lambda: broker.caught_up("SC", "T")), 10)
    assert sorted(first + again) == sorted(f"c{i}".encode() for i in range(20))   # nothing twice


def test_sync_push_consumer_reports_in_flight_ages(cluster):
    """The blocking facade exposes the consume-timeout view (`in_flight_ages`): a queue whose
    message is still in the listener shows its age; 0 once the listener returned."""
    with Producer("PGA", cluster.namesrv_addr, instance_name="a1") as p:
        assert p.send(Message("TAges", b"slow")).ok
    entered, release = threading.Event(), threading.Event()

    def listener(msg):
        entered.set()
        assert release.wait(20)

    c = PushConsumer("SGA", cluster.namesrv_addr, listener=listener, instance_name="a2",
                     consume_from_where="FIRST_OFFSET")
    c.subscribe("TAges")
    with c:
        assert entered.wait(10)
        time.sleep(0.05)        # let the message age measurably: the age is what is tested
        ages = c.in_flight_ages()
        busy = {mq: age for mq, age in ages.items() if age}
        assert len(busy) == 1 and next(iter(busy)).topic == "TAges"
        assert next(iter(busy.values())) >= 50
        release.set()
        assert c.drain(10)
        assert not any(c.in_flight_ages().values())
