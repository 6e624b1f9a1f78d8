"""Executor side of a batch write: rows -> Messages -> Producer.send_batch per topic, in
chunks of `batchSize`. A send that raises fails the task with the producer's reason."""
from __future__ import annotations

from pocketmq.client import Message
from pocketmq.client import sync
from pocketmq.client.instance import default_instance_name
from pocketmq.spark.options import WriterOptions

_producers: dict[tuple, sync.Producer] = {}


def _producer(opts: WriterOptions) -> sync.Producer:
    key = (opts.namesrv_addr, opts.producer_group, opts.credentials, opts.tls)
    p = _producers.get(key)
    if p is None:
        # an instance of its own per cached producer: this cache lives as long as the process,
        # and sharing the process's default instance would hand its broker table (another
        # cluster's, another account's) to the application's own clients
        p = _producers[key] = sync.Producer(opts.producer_group, opts.namesrv_addr,
                                            instance_name=f"spark-sink-{default_instance_name()}-{len(_producers)}",
                                            credentials=opts.credentials, tls=opts.tls or None).start()
    return p


def row_to_message(row, default_topic: str | None) -> Message:
    d = row.asDict() if hasattr(row, "asDict") else dict(row)
    topic = d.get("topic") or default_topic
    if not topic:
        raise ValueError("pocketmq writer: a row has no topic (no topic column value and no topic option)")
    if "body" not in d:
        raise ValueError("pocketmq writer: the DataFrame needs a body column (binary or string)")
    body = d["body"]
    if body is None:
        raise ValueError(f"pocketmq writer: a row for topic {topic} has a null body")
    keys = d.get("keys")
    props = d.get("properties") or {}
    return Message(topic, body if isinstance(body, (bytes, str)) else bytes(body), tags=d.get("tags") or None,
                   keys=keys.split(" ") if isinstance(keys, str) and keys else (keys or ()),
                   properties={str(k): str(v) for k, v in dict(props).items() if v is not None})


def write_rows(opts: WriterOptions, rows) -> tuple[int, int]:
    """Send every row; returns (messages, send_batch calls). Raises on the first failure."""
    producer = None
    pending: dict[str, list[Message]] = {}
    sent = batches = 0

    def flush(topic: str) -> None:
        nonlocal producer, sent, batches
        msgs = pending.pop(topic, None)
        if not msgs:
            return
        if producer is None:
            producer = _producer(opts)
        try:
            producer.send_batch(msgs)
        except Exception as e:
            raise RuntimeError(f"pocketmq writer: sending {len(msgs)} messages to topic {topic} failed: {e}") from e
        sent += len(msgs)
        batches += 1

    for row in rows:
        m = row_to_message(row, opts.topic)
        group = pending.setdefault(m.topic, [])
        group.append(m)
        if len(group) >= opts.batch_size:
            flush(m.topic)
    for topic in list(pending):
        flush(topic)
    return sent, batches
