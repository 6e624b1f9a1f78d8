"""Fuzz both daemons (issue 11, "Build as lasting tests"): seeded hostile input, real processes.

Each case opens its own connection and sends one of:
  * garbage: random bytes, some behind a plausible length prefix;
  * a mutated valid frame: bit flips, truncation, a lying frame length or header length,
    an unknown serialize type, trailing garbage;
  * a valid frame of a code the daemon serves with hostile header fields (lone
    surrogates, numbers past int32/int64, blanks, 5,000-character names...), followed on
    the same connection by a valid request: both must be answered (an input error is
    answered and costs nothing else);
  * a valid frame with a hostile body (not UTF-8, not JSON, the wrong shape, deep nesting,
    bit-flipped valid bodies, hostile values in the right places).
After each case a valid request from ANOTHER client must succeed. Invariants: the daemon
never exits, its log never shows a traceback (tracebacks are for our bugs, not for bad
input), and a failure stays on its own connection.

Seeded: POCKETMQ_FUZZ_SEED (default: random, printed) and POCKETMQ_FUZZ_ITERATIONS
(cases per daemon, default 500: about ten seconds each). A failure names the seed and the case,
so `POCKETMQ_FUZZ_SEED=<seed> pytest tests/fault` replays it. Release checks run longer,
e.g. POCKETMQ_FUZZ_ITERATIONS=20000 (docs/reliability.md).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import struct

import pytest

from pocketmq.protocol import bodies
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand, encode
from tests.support.daemons import Cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.fault]

ITERATIONS = int(os.environ.get("POCKETMQ_FUZZ_ITERATIONS", "500"))
SEED = int(os.environ.get("POCKETMQ_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
ANSWER_TIMEOUT_S = 10.0

PROBE_TOPIC, PROBE_GROUP = "FuzzProbeTopic", "FuzzProbeGroup"

# A benign value for every header field the daemons read; a case starts from these and
# makes a few of them hostile.
BASE_FIELDS = {
    "topic": "FuzzT", "consumerGroup": "FuzzG", "producerGroup": "FuzzP", "group": "FuzzG",
    "clientID": "10.0.0.9@1", "clientId": "10.0.0.9@1", "queueId": "0", "queueOffset": "0",
    "maxMsgNums": "1", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
    "subscription": "*", "subVersion": "0", "expressionType": "TAG", "offset": "0", "delayLevel": "0",
    "originMsgId": "0A0000010000000000000000", "originTopic": "FuzzT", "maxReconsumeTimes": "3",
    "timestamp": "0", "isForce": "false", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6",
    "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false", "defaultTopic": "TBW102",
    "brokerName": "fuzz-b", "brokerAddr": "127.0.0.1:1", "clusterName": "FuzzC", "cluster": "FuzzC",
    "haServerAddr": "127.0.0.1:2", "brokerId": "0", "compressed": "false", "bodyCrc32": "0",
    "namespace": "FuzzNS", "key": "k", "value": "v", "msgId": "0A0000010000000000000000",
    "defaultTopicQueueNums": "4", "bornTimestamp": "1", "flag": "0", "properties": "",
    "reconsumeTimes": "0", "unitMode": "false", "batch": "false",
    "a": "FuzzP", "b": "FuzzT", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
    "i": "", "j": "0", "k": "false", "m": "false",
}
HOSTILE_VALUES = [
    "", "x\ud800", "\udfff", "a\ud83d", "-1", "0", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", str(-2**63 - 1), "1" * 40, "1e9", "0x10", " 1",
    "nan", "true", "a" * 300, "A" * 5000, "%RETRY%", "%DLQ%x", "\x00", "../../etc/passwd", "{", "T\nX",
    "é", "SCHEDULE_TOPIC_XXXX", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "DELAY\x011\x02", "\x01\x02",
]
BODY_KEYS = ["clientID", "clientId", "consumerGroup", "group", "producerDataSet", "consumerDataSet",
             "mqSet", "topicConfigTable", "topicConfigSerializeWrapper", "dataVersion", "groupName",
             "subscriptionData", "offsetTable", "subscriptionDataSet", "topic", "brokerName", "queueId",
             "retryQueueNums", "retryMaxTimes", "consumeEnable", "tagsSet", "subString", "expressionType"]


def _hostile_json_value(rng: random.Random, depth: int = 0):
    pick = rng.randrange(9 if depth < 3 else 5)
    if pick == 0:
        return rng.choice(HOSTILE_VALUES)
    if pick == 1:
        return rng.choice([0, -1, 2**31, 2**63, -2**63 - 1, 10**30, 1.5, float("1e308")])
    if pick == 2:
        return rng.choice([None, True, False])
    if pick == 3:
        return rng.choice(["", "T1", "G1", "c@1", "broker-a"])
    if pick == 4:
        return rng.random()
    if pick in (5, 6):
        return {rng.choice(BODY_KEYS): _hostile_json_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_hostile_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _valid_bodies():
    hb = bodies.HeartbeatData("10.0.0.9@1", ["FuzzP"], [bodies.ConsumerData(
        "FuzzG", subscription_data_set=[bodies.build_subscription("FuzzT", "A || B")])])
    mq = bodies.MessageQueue("FuzzT", "broker-a", 0)
    return [bodies.dumps(hb.to_json()), bodies.encode_lock_body("FuzzG", "10.0.0.9@1", [mq]),
            bodies.encode_register_broker_body({"FuzzT": bodies.TopicConfig("FuzzT")}, bodies.DataVersion(1, 1)),
            bodies.dumps(bodies.SubscriptionGroupConfig("FuzzG").to_json()),
            bodies.encode_reset_offset_body({mq: 0}), bodies.dumps({"subscriptionData": hb.to_json()})]


VALID_BODIES = _valid_bodies()


def _hostile_body(rng: random.Random) -> bytes:
    pick = rng.randrange(7)
    if pick == 0:
        return rng.randbytes(rng.randrange(64))
    if pick == 1:
        return rng.choice([b"\xff\xfe{", b"{", b"[]", b"null", b'"x"', b"[" * 3000, b"{" * 3000,
                           b'{"a":' * 200, b"{0:1}", b"{{1:2}:3}", b"\xc0\x80", b'{"clientID":"\\ud800"}'])
    if pick == 2:                      # a valid body with bits flipped
        body = bytearray(rng.choice(VALID_BODIES))
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(body))
            body[i] ^= 1 << rng.randrange(8)
        return bytes(body)
    if pick == 3:                      # a valid body cut short
        body = rng.choice(VALID_BODIES)
        return body[:rng.randrange(len(body))]
    # JSON of the wrong shape or with hostile values where names and numbers go
    obj = {k: _hostile_json_value(rng) for k in rng.sample(BODY_KEYS, rng.randrange(1, 6))}
    if rng.random() < 0.3:
        obj = json.loads(rng.choice(VALID_BODIES[:4]).decode())   # the standard-JSON ones
        if isinstance(obj, dict) and obj:
            obj[rng.choice(list(obj))] = _hostile_json_value(rng)
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def _request(rng: random.Random, codes: list[int], hostile_header: bool, hostile_body: bool) -> RemotingCommand:
    code = rng.choice(codes)
    ext = dict(BASE_FIELDS)
    if hostile_header:
        # few fields (the answer names the one) or many (a code's own fields are surely hit)
        n = rng.randrange(1, 4) if rng.random() < 0.5 else rng.randrange(5, 25)
        for key in rng.sample(list(BASE_FIELDS), n):
            if rng.random() < 0.15:
                del ext[key]
            else:
                ext[key] = rng.choice(HOSTILE_VALUES)
    body = _hostile_body(rng) if hostile_body else rng.choice([b""] + VALID_BODIES)
    stype = rng.choice([SerializeType.JSON, SerializeType.JSON, SerializeType.ROCKETMQ, SerializeType.MSGPACK])
    if code > 0x7FFF and stype == SerializeType.ROCKETMQ:
        stype = SerializeType.JSON     # RocketMQ 5's codes (POP 200050...) do not fit the binary header's short
    return RemotingCommand(code, rng.randrange(1, 2**31), 0, None, ext, body, serialize_type=stype)


def _mutate_frame(rng: random.Random, frame: bytes) -> bytes:
    f = bytearray(frame)
    pick = rng.randrange(6)
    if pick == 0:                                              # bit flips anywhere
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(f))
            f[i] ^= 1 << rng.randrange(8)
    elif pick == 1:                                            # truncated
        del f[rng.randrange(len(f)):]
    elif pick == 2:                                            # frame length lies
        struct.pack_into(">i", f, 0, rng.choice([0, 3, 4, len(f) - 4 + rng.randrange(1, 100), len(f) // 2,
                                                 -1, 2**31 - 1, 17 * 1024 * 1024]))
    elif pick == 3:                                            # header length lies
        (ori,) = struct.unpack_from(">i", f, 4)
        struct.pack_into(">i", f, 4, (ori & ~0xFFFFFF) | rng.randrange(0, 1 << 24))
    elif pick == 4:                                            # unknown serialize type
        f[4] = rng.randrange(3, 256)
    else:                                                      # trailing garbage
        f += rng.randbytes(rng.randrange(1, 64))
    return bytes(f)


def _garbage(rng: random.Random) -> bytes:
    data = rng.randbytes(rng.randrange(1, 300))
    if rng.random() < 0.5:                                     # a plausible prefix, garbage after
        data = struct.pack(">ii", len(data) + 4, rng.choice([0, 1, 2]) << 24 | min(len(data), rng.randrange(1, 40))) + data
    return data


async def _exchange(addr: str, data: bytes, expect_opaques: set[int]) -> dict:
    """Send `data` on a new connection; wait for answers to `expect_opaques` (or EOF when
    none are expected). Returns opaque -> response."""
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answers: dict = {}
    try:
        writer.write(data)
        await writer.drain()
        if not expect_opaques:
            return answers
        dec = FrameDecoder()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_TIMEOUT_S
        while not expect_opaques <= answers.keys():
            chunk = await asyncio.wait_for(reader.read(1 << 16), max(0.01, deadline - loop.time()))
            if not chunk:
                break
            dec.feed(chunk)
            for resp in dec.commands():
                answers[resp.opaque] = resp
        return answers
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


class Probe:
    """Another client's valid requests on one long-lived connection, which must keep working."""

    def __init__(self, addr: str, commands):
        self.addr = addr
        self.commands = commands
        self.reader = self.writer = None
        self.dec = FrameDecoder()
        self.opaque = 0

    async def open(self):
        host, port = self.addr.split(":")
        self.reader, self.writer = await asyncio.open_connection(host, int(port))

    async def check(self, i: int) -> None:
        cmd = self.commands[i % len(self.commands)]()
        self.opaque += 1
        cmd.opaque = self.opaque
        self.writer.write(encode(cmd))
        while True:
            resp = self.dec.next_command()
            if resp is not None and resp.is_response:   # (the broker's NOTIFY_CONSUMER_IDS_CHANGED skipped)
                break
            if resp is not None:
                continue
            chunk = await asyncio.wait_for(self.reader.read(1 << 16), ANSWER_TIMEOUT_S)
            assert chunk, "the probe's connection was closed"
            self.dec.feed(chunk)
        assert resp.opaque == self.opaque and resp.code == C.SUCCESS, f"probe code {cmd.code}: {resp}"

    def close(self):
        if self.writer is not None:
            self.writer.close()


def _send_probe():
    from tests.integration.test_broker import send_cmd
    return send_cmd(PROBE_TOPIC, b"probe")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("fuzz"))).start()
    yield c
    c.stop()


def _codes(role: str) -> list[int]:
    if role == "broker":
        from pocketmq.broker.processors import build_processor_table
        return sorted(build_processor_table(None))
    from pocketmq.nameserver.processors import NamesrvState, build_processor_table
    return sorted(build_processor_table(NamesrvState(None, None)))


async def _fuzz(daemon, addr: str, codes: list[int], probe: Probe, seed: int, iterations: int) -> dict:
    rng = random.Random(seed)
    log_file = open(daemon.log_path, encoding="utf-8", errors="replace")
    log_file.seek(0, os.SEEK_END)
    counts = {"garbage": 0, "mutated": 0, "header": 0, "body": 0, "both": 0}
    answers_by_code: dict = {}    # response code -> how many hostile requests got it (the printed figures)
    await probe.open()
    try:
        for i in range(iterations):
            kind = rng.choice(list(counts))
            desc = kind
            try:
                if kind == "garbage":
                    await _exchange(addr, _garbage(rng), set())
                elif kind == "mutated":
                    cmd = _request(rng, codes, rng.random() < 0.3, rng.random() < 0.3)
                    await _exchange(addr, _mutate_frame(rng, encode(cmd)), set())
                    desc = f"mutated frame of code {cmd.code}"
                else:
                    cmd = _request(rng, codes, kind in ("header", "both"), kind in ("body", "both"))
                    desc = f"{kind}: code {cmd.code} ext={ascii(cmd.ext_fields)[:300]} body={cmd.body[:80]!r}"
                    follow = probe.commands[0]()
                    follow.opaque = cmd.opaque ^ 0x40000000
                    # a PULL may be held (a hostile sysFlag can ask for suspension): not awaited
                    expect = {follow.opaque} | ({cmd.opaque} if cmd.code != R.PULL_MESSAGE else set())
                    answers = await _exchange(addr, encode(cmd) + encode(follow), expect)
                    missing = expect - answers.keys()
                    assert not missing, f"no answer for opaques {missing} (connection dropped?)"
                    assert answers[follow.opaque].code == C.SUCCESS, answers[follow.opaque]
                    if cmd.opaque in answers:
                        rc = answers[cmd.opaque].code
                        answers_by_code[rc] = answers_by_code.get(rc, 0) + 1
                counts[kind] += 1
                await probe.check(i)
                assert daemon.proc.poll() is None, f"{daemon.name} exited with {daemon.proc.returncode}"
                new_log = log_file.read()
                assert "Traceback" not in new_log, f"traceback in {daemon.name}'s log:\n{new_log[-3000:]}"
            except (AssertionError, OSError, asyncio.TimeoutError) as e:
                pytest.fail(f"{daemon.name} fuzz seed={seed} case={i} ({desc}): {type(e).__name__}: {e}\n"
                            f"replay: POCKETMQ_FUZZ_SEED={seed} pytest tests/fault")
    finally:
        probe.close()
        log_file.close()
    return {"cases": counts, "answer codes": dict(sorted(answers_by_code.items()))}


async def test_fuzz_nameserver(cluster):
    print(f"fuzz seed {SEED}, {ITERATIONS} cases")
    probe = Probe(cluster.namesrv_addr, [lambda: RemotingCommand(R.GET_BROKER_CLUSTER_INFO),
                                         lambda: RemotingCommand(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)])
    counts = await _fuzz(cluster.namesrv, cluster.namesrv_addr, _codes("namesrv"), probe, SEED, ITERATIONS)
    print("nameserver cases:", counts)


async def test_fuzz_broker(cluster):
    print(f"fuzz seed {SEED}, {ITERATIONS} cases")
    # a consumer of the probe group stays registered: GET_CONSUMER_LIST_BY_GROUP must keep working
    member = Probe(cluster.broker_addr, [lambda: RemotingCommand(R.HEART_BEAT, body=bodies.dumps(
        bodies.HeartbeatData("10.0.0.1@1", [], [bodies.ConsumerData(PROBE_GROUP, subscription_data_set=[
            bodies.build_subscription(PROBE_TOPIC, "*")])]).to_json()))])
    await member.open()
    await member.check(0)
    try:
        probe = Probe(cluster.broker_addr, [
            lambda: RemotingCommand(R.GET_BROKER_RUNTIME_INFO), _send_probe,
            lambda: RemotingCommand(R.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": PROBE_GROUP})])
        counts = await _fuzz(cluster.broker, cluster.broker_addr, _codes("broker"), probe, SEED + 1, ITERATIONS)
        print("broker cases:", counts)
    finally:
        member.close()
