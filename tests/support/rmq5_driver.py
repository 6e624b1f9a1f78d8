"""Drives the official RocketMQ 5.x Python client (rocketmq-python-client) for the tests;
run by tests/support/rmq5.py with the Python of the client's own venv (never ours).

    python rmq5_driver.py ENDPOINT SCENARIO 'JSON ARGS'

Prints one JSON event per line on stdout; exits non-zero on any client error.

Every scenario takes "ak" and "sk" (the client's Credentials; empty by default). `send` with
"catch": true reports a failed start or send as an "error" event (code, type, message)
instead of exiting, and what the client logged at ERROR as "client_log" events (a refused
route query surfaces only there: the send raises "failed to fetch topic route").

Scenarios:
  send         {"topic", "messages": [{"body", "tag"?, "keys"?: [...], "props"?: {...},
                "group"?, "deliver_in_s"?}]}: a Producer's sync sends -> "sent" events
  bench        {"topic", "count", "size"}: `count` sync sends of `size`-byte bodies after a
                warm-up -> one "bench" event (elapsed seconds, sends per second)
  transaction  {"topic", "body", "end": "commit" | "rollback" | "check", "wait_s"?}: a half
                message, then commit or rollback; "check": no end, the checker (answering
                COMMIT) is awaited -> "sent", then "ended" or "checked"
  receive      {"topic", "group", "expect", "invisible_s"?, "batch"?, "tag"? | "sql"?, "ack"?,
                "await_s"?, "seconds"?}: a SimpleConsumer's receives until `expect` messages
                (or `seconds`) -> a "msg" event each, then "acked" / "ack_error" when `ack`
  nack         {"topic", "group"}: receive one message (10 s invisible), change its invisible
                duration to 1 s, ack with the old handle, receive it again, ack, ack again ->
                "msg", "changed", "ack_error", "msg", "acked", "ack_error"
  push         {"topic", "group", "expect", "fail_until"?, "sleep_ms"?, "seconds"?, "linger_s"?,
                "stop_on_stdin"?}: a PushConsumer whose listener takes sleep_ms and fails while a
                message's delivery attempt is below `fail_until` (-1: always), until `expect`
                deliveries (or `seconds`; with stop_on_stdin: until a line or EOF on stdin), then
                linger_s for acks in flight -> "started", a "delivery" event each (body,
                message_id, attempt, message_group, ok, t, thread), "leaving" (stop_on_stdin)
  bench_receive {"topic", "group", "count", "batch"}: receive(batch) + ack each until `count`
                messages -> one "bench" event (elapsed seconds, messages per second)
"""
import json
import logging
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message, MessageListener,
                      Producer, PushConsumer, SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import FilterType


_EMIT = threading.Lock()       # listeners emit from the client's consumption threads


def emit(**event):
    line = json.dumps(event)
    with _EMIT:
        print(line, flush=True)


CREDENTIALS = Credentials()      # set from the scenario's "ak"/"sk" in __main__


def producer(endpoint, topic, checker=None):
    config = ClientConfiguration(endpoint, CREDENTIALS, request_timeout=10)
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


def emit_error(e, where):
    emit(event="error", where=where, code=error_code(e), type=type(e).__name__, message=str(e))


class ClientLog(logging.Handler):
    def emit(self, record):
        emit(event="client_log", message=record.getMessage())


def send(endpoint, args):
    if args.get("catch"):
        handler = ClientLog(logging.ERROR)
        logging.getLogger("rocketmq-python-client").addHandler(handler)
    try:
        p = producer(endpoint, args["topic"])
    except Exception as e:
        if not args.get("catch"):
            raise
        emit_error(e, "startup")
        return
    try:
        for i, spec in enumerate(args["messages"]):
            try:
                r = p.send(build(args["topic"], spec))
            except Exception as e:
                if not args.get("catch"):
                    raise
                emit_error(e, "send")
                continue
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


def config(endpoint):
    return ClientConfiguration(endpoint, CREDENTIALS, request_timeout=10)


def subscription(args):
    if args.get("sql"):
        return FilterExpression(args["sql"], FilterType.SQL)
    return FilterExpression(args.get("tag") or "*")


def describe(m):
    return dict(body=m.body.decode(), message_id=m.message_id, attempt=m.delivery_attempt, tag=m.tag,
                keys=sorted(m.keys), props=dict(m.properties), message_group=m.message_group, topic=m.topic,
                corrupted=m.corrupted)


def simple_consumer(endpoint, args):
    c = SimpleConsumer(config(endpoint), args["group"], {args["topic"]: subscription(args)},
                       await_duration=args.get("await_s", 5))
    c.startup()
    return c


def error_code(e):
    return getattr(e, "code", None) or type(e).__name__


def ack(c, m):
    """Ack one message -> "acked", or "ack_error" with the status code the client raised."""
    try:
        c.ack(m)
        emit(event="acked", message_id=m.message_id)
    except Exception as e:
        emit(event="ack_error", message_id=m.message_id, code=error_code(e), error=str(e))


def receive(endpoint, args):
    c = simple_consumer(endpoint, args)
    got, deadline = 0, time.monotonic() + args.get("seconds", 30)
    try:
        while got < args["expect"] and time.monotonic() < deadline:
            for m in c.receive(args.get("batch", 32), args.get("invisible_s", 15)):
                got += 1
                emit(event="msg", **describe(m))
                if args.get("ack", True):
                    ack(c, m)
    finally:
        c.shutdown()


def receive_one(c, deadline_s=20):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        ms = c.receive(1, 10)
        if ms:
            return ms[0]
    raise SystemExit("no message received")


def nack(endpoint, args):
    c = simple_consumer(endpoint, args)
    try:
        m = receive_one(c)
        emit(event="msg", **describe(m))
        old = m.receipt_handle
        c.change_invisible_duration(m, 1)        # the client adopts the new receipt handle
        emit(event="changed", same_handle=m.receipt_handle == old)
        new = m.receipt_handle
        m.receipt_handle = old
        ack(c, m)
        m.receipt_handle = new
        again = receive_one(c)                   # not acked: back after 1 s, attempt 2
        emit(event="msg", **describe(again))
        ack(c, again)
        ack(c, again)                            # names a lease that is gone
    finally:
        c.shutdown()


class Listener(MessageListener):
    def __init__(self, expect, fail_until, sleep_ms=0):
        self.expect = expect
        self.sleep_s = sleep_ms / 1000
        self.fail_until = fail_until
        self.count = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def consume(self, m):
        ok = not (self.fail_until == -1 or (m.delivery_attempt or 1) < self.fail_until)
        time.sleep(self.sleep_s)
        emit(event="delivery", body=m.body.decode(), message_id=m.message_id, attempt=m.delivery_attempt,
             message_group=m.message_group, ok=ok, t=time.time(), thread=threading.get_ident())
        with self.lock:
            self.count += 1
            if self.count >= self.expect:
                self.done.set()
        return ConsumeResult.SUCCESS if ok else ConsumeResult.FAILURE


def push(endpoint, args):
    listener = Listener(args.get("expect", 1 << 30), args.get("fail_until", 0), args.get("sleep_ms", 0))
    c = PushConsumer(config(endpoint), args["group"], listener, {args["topic"]: subscription(args)})
    c.startup()
    emit(event="started", t=time.time())
    try:
        if args.get("stop_on_stdin"):
            sys.stdin.readline()             # the test says when this consumer leaves
            emit(event="leaving", t=time.time())
        elif not listener.done.wait(args.get("seconds", 30)):
            emit(event="timeout", deliveries=listener.count)
        time.sleep(args.get("linger_s", 0))     # acks in flight reach the broker
    finally:
        c.shutdown()


def bench_receive(endpoint, args):
    c = simple_consumer(endpoint, dict(args, await_s=5))
    try:
        got, t0 = 0, time.perf_counter()
        while got < args["count"]:
            for m in c.receive(args["batch"], 30):
                c.ack(m)
                got += 1
        elapsed = time.perf_counter() - t0
        emit(event="bench", count=got, elapsed_s=elapsed, per_s=got / elapsed)
    finally:
        c.shutdown()


if __name__ == "__main__":
    endpoint, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    _args = json.loads(raw)
    CREDENTIALS = Credentials(_args.get("ak", ""), _args.get("sk", ""))
    {"send": send, "bench": bench, "transaction": transaction, "receive": receive, "nack": nack, "push": push,
     "bench_receive": bench_receive}[scenario](endpoint, _args)
