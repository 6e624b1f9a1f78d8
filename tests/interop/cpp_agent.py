"""Drive the Apache RocketMQ C++ client (PyPI `rocketmq==0.4.4`) from a subprocess.

Each run prints one JSON object per line on stdout, so tests can parse what
the C++ client saw. Run it with HOME pointing at a temp dir (librocketmq
writes its logs under ~/logs).

    python cpp_agent.py produce --ns ADDR --topic T --mode sync --count 10
    python cpp_agent.py push --ns ADDR --group G --topic T --expect 10 --idle 5
    python cpp_agent.py pull --ns ADDR --group G --topic T --expect 10
    python cpp_agent.py push --ns ADDR --group G --topic T --fail-until 2 --fail-how status
        (the callback fails while reconsume_times < 2; --fail-until -1: always fails;
        every delivery is emitted with its msg id, reconsume_times and retry properties)
    python cpp_agent.py push ... --start-file PATH   (prints "ready", starts once PATH exists)
    python cpp_agent.py push ... --orderly   (the C++ orderly push consumer: queue locks,
        one queue at a time per thread; deliveries carry a wall-clock `t`)
    python cpp_agent.py push ... --model broadcasting --instance bc1
        (a BROADCASTING consumer: every member gets every queue, offsets kept locally)
    python cpp_agent.py push ... --expr "TagA || TagB"   (a tag subscription; pull takes --expr too)
    python cpp_agent.py produce ... --delay-level 2,0,1
        (message i gets set_delay_time_level(levels[i % len]); 0: not set. Every `sent`
        event carries `level` and the wall clock just before (`t0`) and after (`t1`) the send)
    python cpp_agent.py produce ... --mode orderly|oneway_orderly --selector hash|reverse --orderly-arg mod4|triangle
        (send_orderly / send_oneway_orderly with the int argument i % 4 (mod4) or i*(i+1)/2
        (triangle); the queue selector is the wheel's hashing one (arg % mq_size) or its
        mirror (mq_size - 1 - arg % mq_size); `sent` carries `arg`, `mq_size` and the
        `queue` index the selector returned)
    python cpp_agent.py produce ... --sizes 100,4096,60000 --body text,binary
        (message i's body is make_body(prefix, i, sizes[i % len], kinds[i % len]): varied,
        reproducible bytes a test can rebuild; set with SetByteMessageBody, so NULs survive.
        `sent` carries `size` and `sha256` of the body as given to the client)
    python cpp_agent.py produce ... --compress-level 9 --max-message-size 1048576
        (the wheel's Producer(compress_level=, max_message_size=); C++ 1.2.x compresses a
        single message's body of 4096 bytes or more with zlib at that level (default 5) and
        refuses bodies over max_message_size itself (default 128 KiB))
    A send that raises (sync/oneway/orderly/batch modes) is reported as {"event": "error", "idx",
    "error_type", "error", "t0", "t1"} (batch: `idx` is the batch's list) and the run goes on
    with the next message.
    python cpp_agent.py push|pull ... --body-head 32
        (a delivery's `body` is cut to its first 32 characters; every `msg` event carries the
        body's `len` and `sha256` anyway: of the bytes GetMessageBody gives, a C string, so a
        body is cut at its first NUL on the C++ receiving side)
    python cpp_agent.py push ... --batch-max 8   (set_message_batch_max_size(8))
    python cpp_agent.py push ... --gate-file PATH --max-cache 20
        (the callback waits while PATH exists, before it records the message; each queue caches
        at most 20 messages (plus one pull's batch) before the C++ consumer stops pulling it:
        setMaxCacheMsgSizePerQueue, not in the C API, called on the consumer's handle)
    python cpp_agent.py push ... --log-level fatal   (the C++ client's own log, ~/logs/rocketmq-cpp)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import threading
import time


def emit(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
          "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")
_BYTES = bytes([0, 1, 2, 9, 10, 13, 32, 0x7f, 0x80, 0x81, 0xc3, 0xe2, 0xef, 0xfd, 0xfe, 0xff])


def make_body(prefix: str, i: int, size: int, kind: str) -> bytes:
    """`size` bytes starting with "<prefix>-<i>:", the rest drawn from a generator seeded by
    (prefix, i, kind): "text" (words, compressible, no NUL), "binary" (16 byte values incl.
    NUL and non-UTF-8 bytes: compressible about 2:1) or "random" (incompressible)."""
    rng = random.Random(f"{prefix}-{i}-{kind}")
    head = f"{prefix}-{i}:".encode()
    n = max(0, size - len(head))
    if kind == "text":
        words = " ".join(rng.choices(_WORDS, k=n // 5 + 1)).encode()
        rest = words[:n]
    elif kind == "binary":
        rest = bytes(rng.choices(_BYTES, k=n))
    elif kind == "random":
        rest = rng.randbytes(n)
    else:
        raise ValueError(f"unknown body kind {kind!r}")
    return head + rest


def _cycled(spec: str, i: int, conv=str):
    items = [conv(x) for x in spec.split(",") if x.strip()]
    return items[i % len(items)]


def _body(i, args) -> bytes:
    if args.sizes:
        return make_body(args.prefix, i, _cycled(args.sizes, i, int), _cycled(args.body, i))
    body = f"{args.prefix}-{i}"
    if args.size > len(body):
        body += "." * (args.size - len(body))
    return body.encode()


def _message(topic, i, args):
    from rocketmq.client import Message
    from rocketmq.ffi import dll
    from rocketmq.exceptions import ffi_check
    m = Message(topic)
    body = _body(i, args)
    ffi_check(dll.SetByteMessageBody(m, body, len(body)))
    m.set_tags(args.tags)
    m.set_keys(f"key-{i}")
    m.set_property("idx", str(i))
    m.set_property("origin", "cpp")
    level = _delay_level(i, args)
    if level:
        m.set_delay_time_level(level)
    return m


def _delay_level(i, args):
    levels = [int(x) for x in args.delay_level.split(",") if x.strip()] if args.delay_level else [0]
    return levels[i % len(levels)]


def _orderly_arg(i, args):
    return i % 4 if args.orderly_arg == "mod4" else i * (i + 1) // 2


def _recording_selector(args, chosen):
    """The queue selector for send_orderly / send_oneway_orderly; records what it returned."""
    import ctypes

    def select(mq_size, _msg, arg):
        v = ctypes.cast(arg, ctypes.POINTER(ctypes.c_int))[0]
        q = v % mq_size if args.selector == "hash" else mq_size - 1 - v % mq_size
        chosen.append((mq_size, q))
        return q
    return select


def _warm_up(p, args) -> None:
    """--warmup N: N sync sends of bodies `<prefix>w<i>` (not `<prefix>-<i>`), each reported as a
    `warmup` event, then a short pause. The C++ client's first send fetches the route, and its
    client factory then connects to every broker of it from another thread; a send that needs
    a connection being made there waits a few milliseconds for the transport's lock and fails
    ("GetTransport of ... get timed_mutex timeout"), the retry then going wherever it can
    (seen: a message stored twice on one broker before the other took it, or every attempt
    failing). Tests that count where each message lands warm up first."""
    from rocketmq.client import Message
    for i in range(args.warmup):
        m = Message(args.topic)
        m.set_body(f"{args.prefix}w{i}")
        try:
            r = p.send_sync(m)
            emit(event="warmup", idx=i, status=int(r.status))
        except Exception as e:
            emit(event="warmup", idx=i, error_type=type(e).__name__, error=str(e))
    time.sleep(0.5)


def produce(args):
    from rocketmq.client import Producer
    p = Producer(args.group, timeout=args.timeout_ms, compress_level=args.compress_level,
                 max_message_size=args.max_message_size)
    p.set_namesrv_addr(args.ns)
    p.start()
    try:
        if args.warmup:
            _warm_up(p, args)
        if args.mode == "batch":
            for start in range(0, args.count, args.batch_size):
                idx = list(range(start, min(args.count, start + args.batch_size)))
                t0 = time.time()
                try:
                    r = p.send_batch([_message(args.topic, i, args) for i in idx])
                except Exception as e:   # reported as the other modes report theirs, not fatal
                    emit(event="error", mode="batch", idx=idx, error_type=type(e).__name__, error=str(e),
                         t0=t0, t1=time.time())
                    continue
                emit(event="sent", mode="batch", idx=idx, status=int(r.status), msg_id=r.msg_id, offset=r.offset,
                     t0=t0, t1=time.time())
        elif args.mode == "async":
            done = threading.Semaphore(0)
            results = []

            def ok(r, i=None):
                results.append(r)
                done.release()

            started = time.time()

            def fail(e):
                # when and what: an empty message from the C++ client (seen once in a loaded
                # CI run's first minute) says nothing; the time since the sends began tells a
                # timeout (the producer's --timeout-ms) from a failure at once
                emit(event="error", error=str(e), error_type=type(e).__name__,
                     after_s=round(time.time() - started, 3))
                done.release()
            msgs = []
            for i in range(args.count):
                m = _message(args.topic, i, args)
                msgs.append(m)  # keep alive until the callback ran
                p.send_async(m, lambda r, i=i: (emit(event="sent", mode="async", idx=i, status=int(r.status),
                                                     msg_id=r.msg_id, offset=r.offset), done.release()),
                             fail)
            for _ in range(args.count):
                if not done.acquire(timeout=30):
                    emit(event="error", error="async send timed out")
                    break
        else:
            chosen = []
            selector = _recording_selector(args, chosen)
            for i in range(args.count):
                m = _message(args.topic, i, args)
                sel = {}
                t0 = time.time()
                try:
                    if args.mode == "sync":
                        r = p.send_sync(m)
                    elif args.mode == "oneway":
                        p.send_oneway(m)
                        r = None
                    elif args.mode in ("orderly", "oneway_orderly"):
                        arg = _orderly_arg(i, args)
                        del chosen[:]
                        if args.mode == "orderly":
                            r = p.send_orderly(m, arg, queue_selector=selector)
                        else:
                            p.send_oneway_orderly(m, arg, queue_selector=selector)
                            r = None
                        sel = {"arg": arg, "mq_size": chosen[-1][0], "queue": chosen[-1][1]}
                except Exception as e:   # the wheel's ProducerSend*Failed: reported, not fatal
                    emit(event="error", mode=args.mode, idx=i, error_type=type(e).__name__, error=str(e),
                         t0=t0, t1=time.time())
                    continue
                t1 = time.time()
                res = {} if r is None else {"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
                body = _body(i, args)
                emit(event="sent", mode=args.mode, idx=i, level=_delay_level(i, args), t0=t0, t1=t1,
                     size=len(body), sha256=hashlib.sha256(body).hexdigest(), **res, **sel)
    finally:
        p.shutdown()
    emit(event="done")


_RECV_PROPS = ("idx", "origin", "UNIQ_KEY", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID")


def _recv(msg, body_head=0):
    props = {k: (msg.get_property(k) or b"").decode() for k in _RECV_PROPS}
    body = msg.body
    text = body.decode(errors="replace")
    return dict(event="msg", topic=msg.topic, body=text[:body_head] if body_head else text,
                len=len(body), sha256=hashlib.sha256(body).hexdigest(),
                tags=(msg.tags or b"").decode(), keys=(msg.keys or b"").decode(), props=props,
                queue_id=msg.queue_id, queue_offset=msg.queue_offset, msg_id=msg.id,
                reconsume_times=msg.reconsume_times)


def push_main(args):
    from rocketmq.client import MessageModel, PushConsumer
    c = PushConsumer(args.group, orderly=args.orderly)
    c.set_namesrv_addr(args.ns)
    if args.model == "broadcasting":
        c.set_message_model(MessageModel.BROADCASTING)
    if args.instance:
        c.set_instance_name(args.instance)
    c.set_thread_count(2)
    if args.batch_max:
        c.set_message_batch_max_size(args.batch_max)
    if args.max_cache:
        _set_max_cache(c, args.max_cache)
    if args.log_level:
        from rocketmq.ffi import _CLogLevel, dll
        dll.SetPushConsumerLogLevel(c._handle, getattr(_CLogLevel, args.log_level.upper()))
    lock = threading.Lock()
    state = {"n": 0, "last": time.monotonic()}

    def on_msg(msg):
        while args.gate_file and _exists(args.gate_file):
            time.sleep(0.005)
        rec = _recv(msg, args.body_head)
        failing = args.fail_until < 0 or rec["reconsume_times"] < args.fail_until
        rec["failed"] = failing
        rec["t"] = time.time()
        with lock:
            emit(**rec)
            state["n"] += 1
            state["last"] = time.monotonic()
        return failing

    if args.fail_until == 0:
        c.subscribe(args.topic, on_msg, args.expr)
    elif args.fail_how == "raise":
        # What a user writes: the wrapper turns an exception into RECONSUME_LATER.
        def raising(msg):
            if on_msg(msg):
                raise RuntimeError("consume failed on purpose")
        c.subscribe(args.topic, raising, args.expr)
    else:
        # The status returned through the C API itself (1 = E_RECONSUME_LATER), bypassing the
        # wrapper's exception path (which re-raises inside the ctypes callback).
        from rocketmq.client import RecvMessage
        from rocketmq.ffi import dll

        def status_cb(_consumer, cmsg):
            return 1 if on_msg(RecvMessage(cmsg)) else 0
        dll.Subscribe(c._handle, args.topic.encode(), args.expr.encode())
        c._register_callback(status_cb)
    if args.start_file:
        # ready to start at once: the test decides the moment (e.g. right after a send)
        emit(event="ready")
        give_up = time.monotonic() + 60
        while not _exists(args.start_file) and time.monotonic() < give_up:
            time.sleep(0.002)
    c.start()
    emit(event="started")
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(0.1)
            with lock:
                if args.expect and state["n"] >= args.expect and time.monotonic() - state["last"] > args.linger:
                    break
                if args.stop_file and _exists(args.stop_file):
                    break
    finally:
        # everything the test judges is out before the client's own shutdown, which the
        # C++ client sometimes aborts in (conftest.Agent.run: SHUTDOWN_ABORT)
        emit(event="stopping", count=state["n"])
        c.shutdown()
    emit(event="done", count=state["n"])


def _set_max_cache(consumer, n):
    """DefaultMQPushConsumer::setMaxCacheMsgSizePerQueue (default 1000), which the wheel's C API
    does not expose: C++ 1.2.x's CreatePushConsumer returns the DefaultMQPushConsumer itself as the
    handle, so the member function is called on it (`this` first); read back to be sure."""
    import ctypes
    from rocketmq.ffi import dll
    set_ = dll._ZN8rocketmq21DefaultMQPushConsumer26setMaxCacheMsgSizePerQueueEi
    set_.argtypes, set_.restype = [ctypes.c_void_p, ctypes.c_int], None
    get = dll._ZNK8rocketmq21DefaultMQPushConsumer26getMaxCacheMsgSizePerQueueEv
    get.argtypes, get.restype = [ctypes.c_void_p], ctypes.c_int
    set_(consumer._handle, n)
    if get(consumer._handle) != n:
        raise RuntimeError(f"setMaxCacheMsgSizePerQueue({n}) did not take: {get(consumer._handle)}")


def _exists(path):
    import os
    return os.path.exists(path)


def pull_main(args):
    from rocketmq.client import PullConsumer
    c = PullConsumer(args.group)
    c.set_namesrv_addr(args.ns)
    c.start()
    n = 0
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline and (not args.expect or n < args.expect):
            for msg in c.pull(args.topic, args.expr):
                emit(**_recv(msg, args.body_head))
                n += 1
            time.sleep(0.2)
    finally:
        c.shutdown()
    emit(event="done", count=n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["produce", "push", "pull"])
    p.add_argument("--ns", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="cpp_group")
    p.add_argument("--mode", default="sync",
                   choices=["sync", "async", "oneway", "orderly", "oneway_orderly", "batch"])
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--tags", default="TagA")
    p.add_argument("--prefix", default="m")
    p.add_argument("--expr", default="*")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--linger", type=float, default=2.0)
    p.add_argument("--instance", default="")
    p.add_argument("--stop-file", default="")
    p.add_argument("--start-file", default="", help="push: start the consumer once this file exists")
    p.add_argument("--timeout-ms", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=0,
                   help="produce: this many sync sends first (bodies <prefix>w<i>), then 0.5 s (_warm_up)")
    p.add_argument("--size", type=int, default=0, help="pad bodies to this many bytes")
    p.add_argument("--sizes", default="",
                   help="produce: comma-separated body sizes, cycled; bodies are make_body(...)")
    p.add_argument("--body", default="text", help="produce with --sizes: body kinds, comma-separated, cycled "
                   "(text, binary, random)")
    p.add_argument("--compress-level", type=int, default=None, help="produce: Producer(compress_level=)")
    p.add_argument("--max-message-size", type=int, default=None, help="produce: Producer(max_message_size=)")
    p.add_argument("--body-head", type=int, default=0,
                   help="push/pull: emit only this many characters of each body (0: all)")
    p.add_argument("--batch-max", type=int, default=0, help="push: set_message_batch_max_size")
    p.add_argument("--log-level", default="", choices=["", "fatal", "error", "warn", "info", "debug"],
                   help="push: the C++ client's log level (~/logs/rocketmq-cpp; default info)")
    p.add_argument("--gate-file", default="", help="push: the callback waits while this file exists")
    p.add_argument("--max-cache", type=int, default=0,
                   help="push: messages a queue may cache before the consumer stops pulling it (C++ default 1000)")
    p.add_argument("--fail-until", type=int, default=0,
                   help="push: fail while reconsume_times < N (-1: always fail)")
    p.add_argument("--fail-how", default="status", choices=["status", "raise"])
    p.add_argument("--orderly", action="store_true", help="push: the orderly push consumer")
    p.add_argument("--model", default="clustering", choices=["clustering", "broadcasting"],
                   help="push: the message model")
    p.add_argument("--delay-level", default="",
                   help="produce: comma-separated delay levels, cycled over the messages (0: none)")
    p.add_argument("--selector", default="hash", choices=["hash", "reverse"],
                   help="produce orderly/oneway_orderly: arg %% mq_size, or mq_size - 1 - arg %% mq_size")
    p.add_argument("--orderly-arg", default="mod4", choices=["mod4", "triangle"],
                   help="produce orderly/oneway_orderly: the selector argument, i %% 4 or i*(i+1)/2")
    args = p.parse_args()
    {"produce": produce, "push": push_main, "pull": pull_main}[args.cmd](args)


if __name__ == "__main__":
    main()
