"""SQL92 through the blocking facade (pocketmq.client.sync): the same selector."""
import time

from pocketmq.client import Message, MessageSelector
from tests.integration.test_sql92 import FILTER_ON, SQL, expected, stream
from tests.support.local import local_cluster


def test_blocking_facade_subscribes_by_sql(tmp_path):
    """pocketmq.client.sync takes the same selector (its own loop runs the broker here too)."""
    from pocketmq.client import sync

    async def start():
        cm = local_cluster(str(tmp_path), FILTER_ON)
        ns, broker = await cm.__aenter__()
        return cm, ns

    cm, ns = sync.run(start(), 30)
    try:
        with sync.Producer("PG", ns, instance_name="sp") as p:
            for i, props, tag in stream(30):
                p.send(Message("TF", b"%d" % i, tags=tag, properties=props))
        lite = sync.LitePullConsumer("SYNCSQL", ns, instance_name="sl", consume_from_where="FIRST_OFFSET")
        lite.subscribe("TF", MessageSelector.by_sql(SQL))
        got = []
        with lite:
            end = time.monotonic() + 30
            while len(got) < len(expected(30)) and time.monotonic() < end:
                got += [int(m.body) for m in lite.poll(0.5)]
        assert sorted(got) == expected(30)
    finally:
        sync.run(cm.__aexit__(None, None, None), 30)
