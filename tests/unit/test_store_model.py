"""The file store and MemoryStore agree under seeded random operations, crashes included.

Crash = abandon() (no flush, no checkpoint, abort file left) and sometimes a torn or
bit-flipped record in the part of the commit log that was not flushed yet; the file store's
recovery must cut exactly there, and the reference is truncated at the same offset.
More seeds: POCKETMQ_STORE_MODEL_SEEDS=200 python -m pytest tests/unit/test_store_model.py
"""
from __future__ import annotations

import os
import random
import shutil

import pytest

from pocketmq.broker.store.api import MessageBatchToStore, MessageToStore
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.message import encode_batch_body, head_struct, tags_code

SEG = 4096
N_SEEDS = int(os.environ.get("POCKETMQ_STORE_MODEL_SEEDS", "10"))
N_OPS = int(os.environ.get("POCKETMQ_STORE_MODEL_OPS", "250"))
TOPICS = ["TopicA", "TopicB", "%RETRY%grp", SCHEDULE_TOPIC]
TAGS = [None, "A", "B", "中文", "TagNeg_xyz_12345"]
V4 = (bytes([192, 168, 1, 9]), 50001)
V6 = (bytes.fromhex("20010db8000000000000000000000042"), 50002)


def joined(res) -> bytes:
    return b"".join(bytes(b) for b in res.buffers)


class Model:
    def __init__(self, rng: random.Random, root: str, seed: int) -> None:
        self.rng = rng
        self.seed = seed
        self.root = root
        self.cfg = StoreConfig(
            root, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=20 * 16,
            max_message_size=rng.choice([1500, 3000]),
            max_transfer_bytes_on_message_in_memory=rng.choice([2000, 256 * 1024]),
            max_transfer_count_on_message_in_memory=rng.choice([5, 32]),
            max_transfer_bytes_on_message_in_disk=1000, max_transfer_count_on_message_in_disk=3,
            total_physical_memory_bytes=rng.choice([1 << 40, 20_000]),
            store_host=rng.choice([(bytes([10, 1, 2, 3]), 10911), (bytes(15) + b"\x01", 10911)]))
        self.fs = MessageStore(self.cfg)
        self.ms = MemoryStore(self.cfg)
        self.fs.open()
        self.ms.open()
        self.now = 1_000
        self.step = 0

    def where(self) -> str:
        return f"seed={self.seed} step={self.step}"

    # ---------------------------------------------------------------- inputs

    def props(self) -> str:
        r = self.rng
        parts = []
        t = r.choice(TAGS)
        if t is not None:
            parts.append(f"TAGS\x01{t}")
        if r.random() < 0.7:
            parts.append(f"UNIQ_KEY\x01{r.getrandbits(64):016X}")
        if r.random() < 0.2:
            parts.append("KEYS\x01k1 k2")
        if r.random() < 0.05:
            parts.append("ODD\x01ends in nul\x00")
        s = "\x02".join(parts)
        if r.random() < 0.3 and s:
            s += "\x02"
        return s

    def body(self) -> bytes:
        r = self.rng
        n = r.choice([0, 1, 10, 100, 300, r.randrange(0, 3200)])
        return r.randbytes(n)

    def topic_queue(self) -> tuple[str, int]:
        if self.rng.random() < 0.4:
            return "TopicA", 0      # one long queue: several consume-queue files to clean
        topic = self.rng.choice(TOPICS)
        return topic, self.rng.randrange(20 if topic == SCHEDULE_TOPIC else 4)

    def tick(self) -> int:
        self.now += self.rng.choice([0, 1, 1, 2, 50])
        return self.now

    # ---------------------------------------------------------------- operations

    def op_put(self) -> None:
        r = self.rng
        topic, qid = self.topic_queue()
        sys_flag = r.choices([0, 0x4, 0x8, 0xC, 0x1], [80, 5, 5, 3, 7])[0]
        m = MessageToStore(topic, qid, r.randrange(-5, 5), self.body(), self.props(), sys_flag,
                           self.now - 3, V6 if r.random() < 0.1 else V4, self.tick(), r.randrange(3), 0)
        a, b = self.fs.put_message(m), self.ms.put_message(m)
        assert a == b, self.where()

    def op_batch(self) -> None:
        r = self.rng
        topic, qid = self.topic_queue()
        items = [(r.randrange(3), self.body()[:400], self.props()) for _ in range(r.randrange(0, 7))]
        m = MessageBatchToStore(topic, qid, r.choice([0, 0, 0, 0x8]), self.now, V4, self.tick(), items)
        a, b = self.fs.put_messages(m), self.ms.put_messages(m)
        assert a == b, self.where()

    def op_batch_body(self) -> None:
        # The broker's path: a SEND_BATCH_MESSAGE body parsed and stored in one pass by the
        # file store, against the reference's decode_batch_body + put_messages.
        r = self.rng
        topic, qid = self.topic_queue()
        # small batches often fit the rest of a 4 KiB segment (the one-pass path), large ones
        # may not (the decode + put_messages path): both run
        cut = r.choice([20, 100, 400])
        items = [(r.randrange(3), self.body()[:cut], self.props()) for _ in range(r.randrange(1, 7))]
        body = encode_batch_body(items)
        if r.random() < 0.15:       # malformed: cut short, or a length field broken
            body = body[:r.randrange(len(body))] if r.random() < 0.5 else body[:16] + b"\x7f" + body[17:]
        extra = r.choice([b"", b"CLUSTER\x01DefaultCluster", b"KEYS\x01kk\x02CLUSTER\x01c"])
        args = (topic, qid, r.choice([0, 0, 0, 0x8]), self.now, V4, self.tick(), body, extra, r.randrange(2),
                r.choice([None, 200]))
        outcomes = []
        for store in (self.fs, self.ms):
            try:
                outcomes.append(store.put_batch_body(*args))
            except ValueError as e:
                outcomes.append(("ValueError", str(e)))
        assert outcomes[0] == outcomes[1], (self.where(), outcomes)

    def known_queues(self) -> list[tuple[str, int]]:
        qs = [(t, q) for t in self.ms.topics() for q in self.ms.queue_ids(t)]
        return qs or [("TopicA", 0)]

    def op_get(self) -> None:
        r = self.rng
        topic, qid = r.choice(self.known_queues())
        mn, mx = self.ms.get_min_offset_in_queue(topic, qid), self.ms.get_max_offset_in_queue(topic, qid)
        offset = r.choice([mn, mx, mx + 1, mx + 5, max(0, mn - 1), r.randrange(0, mx + 2)])
        codes = {tags_code(t) for t in r.sample(TAGS, r.randrange(1, 4))}
        flt = None if r.random() < 0.6 else codes.__contains__
        n = r.choice([1, 3, 32, 40])
        a = self.fs.get_message(topic, qid, offset, n, flt)
        b = self.ms.get_message(topic, qid, offset, n, flt)
        assert a[:5] == b[:5], (self.where(), topic, qid, offset, a, b)
        assert joined(a) == joined(b), self.where()
        assert a.buffer_total_size == b.buffer_total_size, self.where()

    def op_query(self) -> None:
        r = self.rng
        topic, qid = r.choice(self.known_queues())
        mx = self.ms.get_max_offset_in_queue(topic, qid)
        off = r.randrange(0, mx + 2)
        ts = self.now - r.randrange(0, 600)
        for name, args in [("get_max_offset_in_queue", (topic, qid)),
                           ("get_min_offset_in_queue", (topic, qid)),
                           ("get_earliest_message_time", (topic, qid)),
                           ("get_message_store_timestamp", (topic, qid, off)),
                           ("get_offset_in_queue_by_time", (topic, qid, ts)),
                           ("check_in_disk_by_consume_offset", (topic, qid, off))]:
            a, b = getattr(self.fs, name)(*args), getattr(self.ms, name)(*args)
            assert a == b, (self.where(), name, args, a, b)
        phys = r.choice(list(self.ms.records) or [0])
        phys = r.choice([phys, phys + 1, self.ms.commit_log_max_offset])
        assert self.fs.look_message_by_offset(phys) == self.ms.look_message_by_offset(phys), self.where()
        assert self.fs.commit_log_min_offset == self.ms.commit_log_min_offset, self.where()
        assert self.fs.commit_log_max_offset == self.ms.commit_log_max_offset, self.where()
        assert self.fs.topics() == self.ms.topics(), self.where()
        for t in self.ms.topics():
            assert self.fs.queue_ids(t) == self.ms.queue_ids(t), self.where()

    def op_flush(self) -> None:
        assert self.fs.flush() == self.fs.commit_log_max_offset
        if self.rng.random() < 0.5:
            self.fs.flush_consume_queues()

    def op_clean(self) -> None:
        a = self.fs.clean_expired_files(self.now, force=True)
        b = self.ms.clean_expired_files(self.now, force=True)
        assert a == b, (self.where(), a, b)

    def op_delete_topic(self) -> None:
        names = [self.rng.choice(TOPICS)]
        assert self.fs.delete_topics(names) == self.ms.delete_topics(names), self.where()

    def op_reopen(self) -> None:
        self.fs.close()
        self.ms.close()
        rep = self.fs.open()
        self.ms.open()
        assert not rep.abnormal and rep.truncated_from == -1, (self.where(), rep)

    def op_rebuild_consume_queues(self) -> None:
        self.fs.close()
        shutil.rmtree(self.cfg.consume_queue_dir)
        self.fs.open()
        self.ms.rebuild_consume_queues()

    def op_crash(self) -> None:
        r = self.rng
        unflushed = [p for p in self.ms.records if p >= self.fs.flushed_offset]
        self.fs.abandon()
        self.ms.abandon()
        expected_end = self.ms.commit_log_max_offset
        if unflushed and r.random() < 0.7:
            phys = r.choice(unflushed)
            rec = self.ms.records[phys]
            path = os.path.join(self.cfg.commit_log_dir, "%020d" % (phys - phys % SEG))
            head = head_struct(int.from_bytes(rec[36:40], "big", signed=True)).size
            body_len = int.from_bytes(rec[head - 4:head], "big")
            with open(path, "r+b") as f:
                if r.random() < 0.5 or body_len == 0:   # torn: the record's tail is zeros
                    k = r.randrange(len(rec))
                    f.seek(phys % SEG + k)
                    f.write(bytes(len(rec) - k))
                    if not any(rec[k:]):
                        phys = expected_end             # nothing changed: nothing to cut
                else:                                    # a flipped bit in the body
                    pos = head + r.randrange(body_len)
                    f.seek(phys % SEG + pos)
                    f.write(bytes([rec[pos] ^ (1 << r.randrange(8))]))
            expected_end = phys
        rep = self.fs.open()
        self.ms.open()
        assert rep.abnormal, self.where()
        assert rep.commit_log_max_offset == expected_end, (self.where(), rep, expected_end)
        if expected_end < self.ms.commit_log_max_offset:
            self.ms.truncate_commit_log(expected_end)

    OPS = [("op_put", 40), ("op_batch", 8), ("op_batch_body", 8), ("op_get", 25), ("op_query", 10), ("op_flush", 5),
           ("op_clean", 2), ("op_delete_topic", 1), ("op_reopen", 2), ("op_rebuild_consume_queues", 1),
           ("op_crash", 4)]

    def run(self, n_ops: int) -> None:
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        for self.step in range(n_ops):
            getattr(self, self.rng.choices(names, weights)[0])()
        self.op_query()
        for t, q in self.known_queues():       # read every queue to the end
            off = self.ms.get_min_offset_in_queue(t, q)
            while off < self.ms.get_max_offset_in_queue(t, q):
                a = self.fs.get_message(t, q, off, 32)
                b = self.ms.get_message(t, q, off, 32)
                assert a[:5] == b[:5] and joined(a) == joined(b), self.where()
                off = a.next_begin_offset
        self.fs.close()


@pytest.mark.parametrize("seed", range(N_SEEDS))
def test_file_store_matches_memory_store(tmp_path, seed):
    print(f"store model seed={seed} (re-run: pytest {__file__} -k 'memory_store and [{seed}]')")
    model = Model(random.Random(seed), str(tmp_path / "store"), seed)
    try:
        model.run(N_OPS)
    except BaseException:
        print(f"FAILED at seed={seed} step={model.step}")
        raise
