"""Crash test (issue 11, "Build as lasting tests"): SIGKILL a SYNC_FLUSH broker under mixed
load at seeded points, restart it, and audit every acknowledged message.

Each round runs 1-16 sender tasks against one topic (4 queues) on small commit-log and
consume-queue files (so files roll often): single sends and SEND_BATCH of 2-8 messages,
bodies of 20-3000 bytes, each body naming itself. At a seeded number of acknowledgements
(or a seeded delay) the broker process gets SIGKILL. Then, by the seed:
  * a plain restart;
  * a kill during recovery: the broker run by `tests.support.paused_recovery` (recovery
    stopped after the commit log was cut, before the consume queues and the checkpoint;
    or after its re-dispatch, before the flush and the checkpoint), killed there, then
    restarted;
  * a kill at a seeded delay after the process starts (before, during or after its
    recovery), then restarted.
After each restart every queue is read from offset 0 to its max offset and audited:
  * every acknowledged SEND_OK message (flushDiskType=SYNC_FLUSH: acked => fsynced) of
    every round so far is present at exactly the queue and queue offset it was acked at,
    with its body;
  * no body appears twice (unacknowledged ones may be lost, never duplicated);
  * queues are contiguous: the records read carry the queue offsets min..max-1 in order,
    each a valid record (body CRC) of this topic and queue.
At the end the broker's log (all its runs) must hold no traceback.

Seeded: POCKETMQ_CRASH_SEED (default: random, printed on failure) and POCKETMQ_CRASH_KILLS
(SIGKILLs under load, default 6: about a minute). Release checks run longer, e.g.
POCKETMQ_CRASH_KILLS=60 (docs/reliability.md).
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import sys

import pytest

from pocketmq.client import Message, Producer
from pocketmq.client.message import SendStatus
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import PullSysFlag, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import body_crc, decode_records_raw
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_client_cluster import create_topic
from tests.support.daemons import READY_BROKER, Cluster, Daemon

pytestmark = [pytest.mark.asyncio, pytest.mark.fault]

SEED = int(os.environ.get("POCKETMQ_CRASH_SEED") or random.SystemRandom().randrange(2**32))
KILLS = int(os.environ.get("POCKETMQ_CRASH_KILLS", "6"))
TOPIC, QUEUES = "CrashTopic", 4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKER_ARGS = ["--flushDiskType=SYNC_FLUSH", "--mappedFileSizeCommitLog=262144",
               f"--mappedFileSizeConsumeQueue={20 * 200}", "--syncFlushTimeout=10000"]
NEVER = re.compile(r"(?!)")
PAUSED = re.compile(r"RECOVERY-PAUSED")
RECOVERED = re.compile(r"WARNING\s+pocketmq\.broker - store recovery: abnormal shutdown \(abort file found\), "
                       r"recovered in (\d+) ms")


class Audit:
    def __init__(self):
        self.acked: dict[str, tuple[int, int]] = {}     # body id -> (queue id, queue offset)
        self.sent = 0
        self.kills = 0
        self.recovery_kills = 0
        self.early_kills = 0
        self.early_kills_after_recovery = 0
        self.recovery_ms: list[int] = []
        self.audits = 0


def _body(ident: str, rng: random.Random) -> bytes:
    return (ident + "|").encode() + bytes([97 + rng.randrange(26)]) * rng.randrange(20, 3000)


def _ident(body: bytes) -> str:
    return body.split(b"|", 1)[0].decode()


async def _sender(producer, rng: random.Random, name: str, audit: Audit, stop: asyncio.Event) -> None:
    seq = 0
    while not stop.is_set():
        qid = rng.randrange(QUEUES)
        mq = MessageQueue(TOPIC, "broker-a", qid)
        n = 1 if rng.random() < 0.6 else rng.randrange(2, 9)
        idents = [f"{name}-{seq + i}" for i in range(n)]
        seq += n
        msgs = [Message(TOPIC, _body(i, rng)) for i in idents]
        audit.sent += n
        try:
            if n == 1:
                results = [await producer.send(msgs[0], queue=mq)]
            else:
                results = await producer.send_batch(msgs, queue=mq)
        except Exception:
            if stop.is_set():
                return
            await asyncio.sleep(0.01)    # the broker is gone or refused: this one is unacked
            continue
        if len(results) != 1 or results[0].status is not SendStatus.SEND_OK:
            continue                     # e.g. FLUSH_DISK_TIMEOUT: not acknowledged
        r = results[0]
        assert r.queue.queue_id == qid
        for i, ident in enumerate(idents):
            audit.acked[ident] = (qid, r.queue_offset + i)


async def _pull_all(client: RemotingClient, addr: str, qid: int) -> tuple[int, list[tuple]]:
    """(max offset, [record tuples]) of one queue, read from offset 0."""
    offset, records, max_offset = 0, [], None
    while True:
        ext = {"consumerGroup": "CrashAuditGroup", "topic": TOPIC, "queueId": str(qid),
               "queueOffset": str(offset), "maxMsgNums": "64", "sysFlag": str(PullSysFlag.SUBSCRIPTION),
               "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0", "subscription": "*",
               "expressionType": "TAG"}
        resp = await client.invoke(addr, RemotingCommand(R.PULL_MESSAGE, ext_fields=ext), 10.0)
        h = resp.ext_fields or {}
        max_offset = int(h.get("maxOffset", 0))
        if resp.code != C.SUCCESS:
            assert resp.code in (C.PULL_NOT_FOUND, C.PULL_OFFSET_MOVED), (resp.code, resp.remark)
            assert offset >= max_offset, f"queue {qid}: pull at {offset} < max {max_offset} answered {resp.code}"
            return max_offset, records
        got = decode_records_raw(resp.body, decompress=False)
        assert got, f"queue {qid}: SUCCESS without records at {offset}"
        records += got
        offset = int(h["nextBeginOffset"])


async def _audit(cluster: Cluster, audit: Audit, where: str) -> None:
    client = RemotingClient()
    seen: dict[str, tuple[int, int]] = {}
    try:
        for qid in range(QUEUES):
            max_offset, records = await _pull_all(client, cluster.broker_addr, qid)
            offsets = [t[3] for t in records]
            assert offsets == list(range(max_offset)), f"{where}: queue {qid} not contiguous: {offsets[:5]}... " \
                                                       f"({len(offsets)} records, max {max_offset})"
            for t in records:
                topic, body, queue_id, queue_offset, crc = t[0], t[1], t[2], t[3], t[14]
                assert topic == TOPIC and queue_id == qid, (where, topic, queue_id, qid)
                assert body_crc(body) == crc, f"{where}: queue {qid} offset {queue_offset}: bad body CRC"
                ident = _ident(body)
                assert ident not in seen, f"{where}: {ident} stored twice: {seen[ident]} and {(qid, queue_offset)}"
                seen[ident] = (qid, queue_offset)
    finally:
        await client.close()
    lost = [(i, place) for i, place in audit.acked.items() if seen.get(i) != place]
    assert not lost, f"{where}: {len(lost)} acknowledged messages lost or moved, e.g. " + ", ".join(
        f"{i} acked at {place}, found at {seen.get(i)}" for i, place in lost[:5])
    audit.audits += 1


def _broker(cluster: Cluster, command=None, ready=READY_BROKER, **env_extra) -> Daemon:
    d = cluster._broker_daemon()
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    return Daemon("mqbroker", d.args, ready, d.log_path, env=env, command=command)


async def _restart(cluster: Cluster, rng: random.Random, audit: Audit) -> str:
    """Start the broker again after a SIGKILL, maybe killing it once more during recovery."""
    how = rng.choice(["plain", "during-recovery", "early-kill"])
    if how == "during-recovery":
        at = rng.choice(["cut", "reput"])
        d = _broker(cluster, [sys.executable, "-m", "tests.support.paused_recovery"], PAUSED,
                    POCKETMQ_PAUSE_AT=at)
        await asyncio.to_thread(d.start, 60)
        d.kill()
        how += f" (after the {at})"
        audit.recovery_kills += 1
    elif how == "early-kill":
        delay = rng.uniform(0.05, 2.5)
        d = _broker(cluster, ready=NEVER)
        try:
            await asyncio.to_thread(d.start, delay)     # not ready by then: killed, RuntimeError
        except RuntimeError:
            pass
        d.kill()
        done = "store recovery:" in d.log_text()
        how += f"@{delay:.2f}s ({'after' if done else 'before the end of'} recovery)"
        audit.early_kills += 1
        audit.early_kills_after_recovery += done
    cluster.broker = _broker(cluster)
    await asyncio.to_thread(cluster.broker.start, 60)
    m = RECOVERED.search(cluster.broker.log_text())
    assert m, "no 'store recovery: abnormal shutdown' WARNING line after a SIGKILL"
    audit.recovery_ms.append(int(m.group(1)))
    return how + f", recovered in {m.group(1)} ms"


async def _round(cluster: Cluster, rng: random.Random, audit: Audit, rnd: int) -> str:
    stop = asyncio.Event()
    senders = rng.randrange(1, 17)
    producer = Producer("CrashProducer", cluster.namesrv_addr, instance_name=f"crash-{rnd}",
                        retry_times_when_send_failed=0, coalesce_sends=False, send_timeout_ms=15000)
    await producer.start()
    acked_before = len(audit.acked)
    target = rng.randrange(20, 400)
    tasks = [asyncio.create_task(_sender(producer, random.Random(rng.random()), f"r{rnd}s{i}", audit, stop))
             for i in range(senders)]
    try:
        async with asyncio.timeout(60):
            while len(audit.acked) - acked_before < target:
                await asyncio.sleep(0.005)
        if rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0, 0.05))
        cluster.broker.kill()                      # SIGKILL, mid-load
        audit.kills += 1
    finally:
        stop.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await producer.close()
    for outcome in outcomes:             # a sender's own check failed (send errors are caught)
        if isinstance(outcome, BaseException):
            raise outcome
    return f"round {rnd}: {senders} senders, killed after {len(audit.acked) - acked_before} acks"


async def test_sigkill_under_load_loses_no_acknowledged_message(tmp_path):
    rng = random.Random(SEED)
    audit = Audit()
    cluster = Cluster(str(tmp_path), broker_args=BROKER_ARGS)
    history: list[str] = []
    try:
        cluster.start()
        await create_topic(cluster, TOPIC, QUEUES)
        for rnd in range(KILLS):
            history.append(await _round(cluster, rng, audit, rnd))
            history[-1] += ", restart: " + await _restart(cluster, rng, audit)
            await _audit(cluster, audit, f"after {history[-1]}")
        cluster.broker.stop()                      # a clean shutdown keeps it all too
        cluster.broker = _broker(cluster)
        cluster.broker.start(60)
        await _audit(cluster, audit, "after a clean restart")
        with open(cluster.broker.log_path) as f:         # every run of the broker, appended
            log_text = f.read()
        assert "Traceback" not in log_text, "a traceback in the broker's log:\n" + log_text[
            max(0, log_text.index("Traceback") - 2000):][:6000]
    except BaseException as e:
        raise AssertionError(f"crash test failed with POCKETMQ_CRASH_SEED={SEED} (replay it with that "
                             f"variable); rounds:\n  " + "\n  ".join(history) + f"\n{type(e).__name__}: {e}") from e
    finally:
        cluster.stop()
    print(f"crash test seed {SEED}: {audit.kills} kills under load, {audit.recovery_kills} during recovery, "
          f"{audit.early_kills} early ({audit.early_kills_after_recovery} of them after recovery had finished), {len(audit.acked)} acked of {audit.sent} sent, {audit.audits} audits; "
          f"recovery after a kill took {min(audit.recovery_ms)}-{max(audit.recovery_ms)} ms "
          f"(median {sorted(audit.recovery_ms)[len(audit.recovery_ms) // 2]})")
    assert audit.kills == KILLS and len(audit.acked) > 0
