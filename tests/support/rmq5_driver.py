"""Drives the official RocketMQ 5.x Python client (rocketmq-python-client) for the tests;
run by tests/support/rmq5.py with the Python of the client's own venv (never ours).

    python rmq5_driver.py ENDPOINT SCENARIO 'JSON ARGS'

Prints one JSON event per line on stdout; exits non-zero on any client error.

Scenarios:
  send         {"topic", "messages": [{"body", "tag"?, "keys"?: [...], "props"?: {...},
                "group"?, "deliver_in_s"?}]}: a Producer's sync sends -> "sent" events
  bench        {"topic", "count", "size"}: `count` sync sends of `size`-byte bodies after a
                warm-up -> one "bench" event (elapsed seconds, sends per second)
  transaction  {"topic", "body", "end": "commit" | "rollback" | "check", "wait_s"?}: a half
                message, then commit or rollback; "check": no end, the checker (answering
                COMMIT) is awaited -> "sent", then "ended" or "checked"
"""
import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker, TransactionResolution


def emit(**event):
    print(json.dumps(event), flush=True)


def producer(endpoint, topic, checker=None):
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    p = Producer(config, (topic,), checker=checker)
    p.startup()
    return p


def build(topic, spec):
    m = Message()
    m.topic = topic
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    if spec.get("keys"):
        m.keys = spec["keys"][0]
    for k, v in (spec.get("props") or {}).items():
        m.add_property(k, v)
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("deliver_in_s"):
        m.delivery_timestamp = int(time.time()) + int(spec["deliver_in_s"])
    return m


def send(endpoint, args):
    p = producer(endpoint, args["topic"])
    try:
        for i, spec in enumerate(args["messages"]):
            r = p.send(build(args["topic"], spec))
            emit(event="sent", i=i, message_id=r.message_id, offset=r.offset, transaction_id=r.transaction_id or "")
    finally:
        p.shutdown()


def bench(endpoint, args):
    p = producer(endpoint, args["topic"])
    try:
        m = build(args["topic"], {"body": "x" * args["size"]})
        for _ in range(50):                  # warm-up: channels, routes, settings
            p.send(m)
        t0 = time.perf_counter()
        for _ in range(args["count"]):
            p.send(m)
        elapsed = time.perf_counter() - t0
        emit(event="bench", count=args["count"], elapsed_s=elapsed, per_s=args["count"] / elapsed)
    finally:
        p.shutdown()


class Checker(TransactionChecker):
    def __init__(self):
        self.checked = threading.Event()
        self.message_id = None

    def check(self, message):
        self.message_id = message.message_id
        self.body = message.body.decode()
        self.checked.set()
        return TransactionResolution.COMMIT


def transaction(endpoint, args):
    checker = Checker()
    p = producer(endpoint, args["topic"], checker)
    try:
        t = p.begin_transaction()
        r = p.send(build(args["topic"], {"body": args["body"], "tag": "tx"}), t)
        emit(event="sent", message_id=r.message_id, transaction_id=r.transaction_id, offset=r.offset)
        if args["end"] == "commit":
            t.commit()
            emit(event="ended", resolution="commit")
        elif args["end"] == "rollback":
            t.rollback()
            emit(event="ended", resolution="rollback")
        else:
            if not checker.checked.wait(args.get("wait_s", 30)):
                raise SystemExit("the broker's transaction check-back never arrived")
            # the client answers EndTransaction(SOURCE_SERVER_CHECK) when check() returns, on its
            # check executor, which shutdown() waits for
            emit(event="checked", message_id=checker.message_id, body=checker.body)
    finally:
        p.shutdown()


if __name__ == "__main__":
    endpoint, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    {"send": send, "bench": bench, "transaction": transaction}[scenario](endpoint, json.loads(raw))
