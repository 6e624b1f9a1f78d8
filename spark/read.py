"""Executor side of a batch read: pull one queue range and yield Arrow record batches.

Uses ClientAPI.pull_message instead of a LitePullConsumer: a range read must stop exactly
at its end offset, and the consumer's fetcher prefetches past it and rebalances; a pull
request asks for at most `end - offset` messages and every record at or past `end` is
dropped.

Column-wise (the pulls ask for the undecoded body, client.api.PULL_BODY): no Python object
per record. protocol.message.record_starts_np finds the record boundaries with numpy (and
which records the column-wise path leaves out: compressed bodies, IPv6 hosts, odd ones;
record_starts' Python walk where its magic-code search is not conclusive); _frame checks
the framing and gathers every fixed field with numpy (one row copy per record's head out
of a sliding window, read as a structured dtype at protocol.message.head_positions) and
cuts body, topic and properties out of the body (_cut_out: a take over a zero-copy array);
segments_to_batch makes the RecordBatch. A batch's pull bodies are framed together
(_batch_parts / _joined_segment: one _frame over their joined bytes) when _judge would keep
every one whole, which is the common case; otherwise body by body.
The records left out are decoded by the client's decode_pull_body (decode_records_raw
tuples, its salvage of undecodable records) and go through records_to_batch; the batches
of both kinds are yielded in queue order (parts_to_batches). A body whose framing or UTF-8
is off anywhere is decoded whole by decode_pull_body, as before. tests/spark/test_columnar.py
pins the column-wise result to records_to_batch's on the same bodies.

Speed (bench/bench_spark.py, docs/benchmarks.md "Spark source"): the records of several
pulls (one coroutine on the client's loop) make one batch of about BATCH_ROWS rows; the
properties texts of the whole batch are parsed once (Properties: split on \x02 by
pyarrow.compute, names and values cut at each chunk's first \x01, every name matched once
against the system keys), pinned to the per-row decode_properties path by
tests/spark/test_pure.py. read_range makes
the batches two ahead in a thread (read_ahead) while the Spark worker writes the previous
ones to the JVM.
"""
from __future__ import annotations

import logging
import queue
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pocketmq.client.api import PULL_BODY, PullRequest, PullResult, decode_pull_body, pull_sys_flag
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.message import (
    KEYS,
    SYSTEM_PROPERTY_KEYS,
    TAGS,
    TOPIC_LENGTH_BYTES_MAX,
    UNIQ_KEY,
    at_every_byte,
    decode_properties,
    format_host,
    head_positions,
    offset_msg_id,
    property_value,
    queue_offset_at,
    record_starts_np,
)
from pocketmq.spark.options import tag_set
from pocketmq.spark.plan import PULL_TIMEOUT_S, READ_GROUP, DataLossError, QueueRange, data_loss_message
from pocketmq.spark.schema import ARROW_SCHEMA, arrow_schema

log = logging.getLogger("pocketmq.spark")

# Messages asked per pull: the broker caps a pull at maxTransferCountOnMessageInMemory
# (1024) and maxTransferBytesOnMessageInMemory (256 KiB: ~800 records of 128 B bodies).
PULL_BATCH = 1024
# Rows per Arrow batch: several pulls go into one (pyarrow.compute's and Spark's costs are
# per batch, and so is the hop to the client's loop: _pulls does a batch's pulls at once).
# 16,384 against 8,192: count() 0.50-0.54x against 0.48-0.51x the prebuilt-batch source in
# alternating sessions since a batch's bodies are framed together (docs/benchmarks.md, issue
# 35 item 4, seventeenth session); 32,768 was no faster. A batch's bodies are ~6 MB at 128 B
# messages; a reader holds a few (READ_AHEAD made ahead, one being made, one pulled ahead).
BATCH_ROWS = 16384


_SYSTEM_KEYS = None      # pa.array of SYSTEM_PROPERTY_KEYS, sorted, made on first use (pyarrow loads lazily in workers)
_SYSTEM_INDEX = {name: i for i, name in enumerate(sorted(SYSTEM_PROPERTY_KEYS))}


def _system_keys() -> pa.Array:
    global _SYSTEM_KEYS
    if _SYSTEM_KEYS is None:
        _SYSTEM_KEYS = pa.array(sorted(SYSTEM_PROPERTY_KEYS), pa.string())
    return _SYSTEM_KEYS


class Properties:
    """The properties texts of a batch (one per row) parsed once, decode_properties' rules
    applied by pyarrow.compute over all rows at once: chunks split on \x02, a chunk kept
    only when its first \x01 is neither its first nor its last char (name before it, value
    after it). Every kept entry's name is matched once against SYSTEM_PROPERTY_KEYS
    (index_in); `lookup` (a name's last value per row: decode_properties' dict, later
    duplicates win) and `user_map` (the entries whose name is not a system key) are numpy
    selections over those codes. tests/spark/test_pure.py pins both to decode_properties."""

    def __init__(self, texts: pa.Array):
        chunk_lists = pc.split_pattern(texts, "\x02")
        chunks = chunk_lists.flatten()
        bounds = np.frombuffer(chunks.buffers()[1], np.int32, len(chunks) + 1, chunks.offset * 4).astype(np.int64)
        start, end = bounds[:-1], bounds[1:]
        at = start + pc.find_substring(chunks, "\x01").to_numpy()      # start - 1 where there is none
        valid = (at > start) & (at < end - 1)
        # names and values cut out of the chunks' buffer: one binary array whose values are,
        # per kept chunk, name / \x01 / value / the gap to the next kept chunk
        at, cut = at[valid], np.empty(4 * int(valid.sum()), np.int32)
        cut[0::4], cut[1::4], cut[2::4], cut[3::4] = start[valid], at, at + 1, end[valid]
        pieces = pa.StringArray.from_buffers(max(len(cut) - 1, 0), pa.py_buffer(cut), chunks.buffers()[2])
        self.n = len(texts)
        self.texts = texts
        self.names = pieces.take(pa.array(np.arange(0, len(cut), 4)))
        self.values = pieces.take(pa.array(np.arange(2, len(cut), 4)))
        kept = np.zeros(len(valid) + 1, np.int64)
        np.cumsum(valid, out=kept[1:])
        self.offsets = kept[chunk_lists.offsets.to_numpy()]        # each row's entries: offsets[r]..offsets[r+1]
        self.row = np.repeat(np.arange(self.n), np.diff(self.offsets))
        self.codes = pc.index_in(self.names, value_set=_system_keys()).fill_null(-1).to_numpy()

    def lookup(self, name: str) -> pa.Array:
        """The value of `name` per row (its last entry in the row), null where absent."""
        code = _SYSTEM_INDEX.get(name)
        if code is not None:
            hits = np.flatnonzero(self.codes == code)
        else:
            hits = np.flatnonzero(pc.equal(self.names, name).to_numpy(zero_copy_only=False))
        rows = self.row[hits]
        last = np.ones(len(hits), bool)
        last[:-1] = rows[1:] != rows[:-1]       # entries come in row order: the last of each row wins
        which = np.full(self.n, -1, np.int64)
        which[rows[last]] = hits[last]
        return self.values.take(pa.array(which, mask=which < 0))

    def user_map(self) -> pa.MapArray:
        """decode_properties' dict minus SYSTEM_PROPERTY_KEYS per row, in its order (rows
        whose user properties repeat a name are rebuilt from decode_properties)."""
        user = np.flatnonzero(self.codes < 0)
        offsets = np.zeros(self.n + 1, np.int32)
        np.cumsum(np.bincount(self.row[user], minlength=self.n), out=offsets[1:])
        offsets = pa.array(offsets)
        picked = pa.array(user)
        names = self.names.take(picked)
        if len(names) > 1 and _has_duplicate_names(offsets, names):
            return _user_map_plain(self.texts.to_pylist())
        return pa.MapArray.from_arrays(offsets, names, self.values.take(picked))


class UniformProperties:
    """Properties texts whose rows all hold the same names in the same order (one producer's
    messages: the common case), parsed from their separators' positions alone: one pass
    finds every \x01 and \x02, and when each row has the same sequence of them (one \x01
    per chunk, optionally a trailing \x02) and the same names (compared as bytes), each
    entry is a column of positions. `lookup` and `user_map` are one `take` each of the
    values cut out of the texts' buffer. decode_properties' rules hold: an entry whose
    value is empty is dropped (null / left out of the map), and of a name written twice
    (the broker appends WAIT to a batch's elements that carry it) the last kept value wins;
    a user property's name written twice is left to Properties (`uniform_properties`
    declines)."""

    def __init__(self, n: int, names: list[str], pieces: pa.StringArray, present: np.ndarray):
        self.n = n
        self.names = names                      # the entries' names, in text order
        self.where: dict[str, list[int]] = {}   # name -> its entries, in text order
        for j, name in enumerate(names):
            self.where.setdefault(name, []).append(j)
        self.pieces = pieces                    # piece 2 * (r * E + j): row r's value of entry j
        self.present = present                  # (n, E): the value is not empty

    def _values(self, rows_entries: np.ndarray, mask=None) -> pa.Array:
        return self.pieces.take(pa.array(2 * rows_entries, mask=mask))

    def lookup(self, name: str) -> pa.Array:
        """The value of `name` per row (its last entry with a value), null where absent."""
        entries = self.where.get(name)
        if entries is None:
            return pa.nulls(self.n, pa.string())
        flat = np.arange(self.n, dtype=np.int64) * len(self.names)
        which = flat + entries[0]
        found = self.present[:, entries[0]]
        for j in entries[1:]:
            here = self.present[:, j]
            which = np.where(here, flat + j, which)
            found = found | here
        return self._values(which, ~found)

    def user_map(self) -> pa.MapArray:
        """The entries whose name is not a system key, per row in text order."""
        user = np.array([j for j, name in enumerate(self.names) if name not in SYSTEM_PROPERTY_KEYS], np.int64)
        kept = self.present[:, user]
        offsets = np.zeros(self.n + 1, np.int32)
        np.cumsum(kept.sum(axis=1), out=offsets[1:])
        rows, which = np.nonzero(kept)          # row-major: each row's entries in text order
        keys = pa.array([self.names[j] for j in user.tolist()], pa.string()).take(pa.array(which))
        return pa.MapArray.from_arrays(pa.array(offsets), keys, self._values(rows * len(self.names) + user[which]))


def uniform_properties(texts: pa.Array) -> UniformProperties | None:
    """UniformProperties of `texts` when every row has the same entries (see there), else
    None. Only the \x02 separators are searched (one flatnonzero over the texts: the
    \x01s as well cost twice as much, numpy's nonzero paying per hit): row 0's chunks give
    each entry's name, and every row's chunk j is checked to open with that name and a
    \x01 (so its first \x01 is there, as decode_properties splits); what follows, \x01s
    and \x00s included, is the value. tests/spark/test_pure.py pins its answers to
    decode_properties."""
    n = len(texts)
    if n < 2 or texts.null_count or texts.buffers()[2] is None:
        return None
    offs = np.frombuffer(texts.buffers()[1], np.int32, n + 1, texts.offset * 4).astype(np.int64)
    data = np.frombuffer(texts.buffers()[2], np.uint8)
    lo, hi = int(offs[0]), int(offs[-1])
    seps = np.flatnonzero(data[lo:hi] == 2) + lo
    k = len(seps) // n
    if k * n != len(seps):
        return None
    row_start, row_end = offs[:-1], offs[1:]
    seps = seps.reshape(n, k)
    if k and not ((seps[:, 0] >= row_start) & (seps[:, -1] < row_end)).all():
        return None                              # the same count in every row: each block inside its row
    trailing = k > 0 and int(seps[0, -1]) == int(row_end[0]) - 1
    if k and not ((seps[:, -1] == row_end - 1) == trailing).all():
        return None                              # a trailing \x02 in some rows only
    e = k if trailing else k + 1                 # chunks holding an entry (a trailing \x02 ends none)
    starts = np.empty((n, e), np.int64)
    ends = np.empty((n, e), np.int64)
    starts[:, 0] = row_start
    starts[:, 1:] = seps[:, :e - 1] + 1
    ends[:, :e - 1] = seps[:, :e - 1]
    ends[:, e - 1] = row_end if not trailing else seps[:, e - 1]
    names = []
    lengths = np.empty(e, np.int64)
    for j in range(e):
        chunk = data[starts[0, j]:ends[0, j]]
        ones = np.flatnonzero(chunk == 1)
        if not len(ones) or ones[0] == 0:
            return None                          # row 0's chunk has no name (dropped there): not uniform
        lengths[j] = length = int(ones[0])
        if not (starts[:, j] + length < ends[:, j]).all():
            return None                          # a chunk too short for the name and its \x01
        if not _same_bytes(data, starts[:, j], chunk[:length + 1]):     # the name and its \x01
            return None
        names.append(chunk[:length].tobytes().decode("utf-8"))
    at = starts + lengths                        # each entry's \x01
    user = [name for name in names if name not in SYSTEM_PROPERTY_KEYS]
    if len(set(user)) != len(user):
        return None                              # a user name twice: Properties keeps dict order
    cut = np.empty(2 * n * e, np.int32)          # value (r, j) / the gap to the next value
    cut[0::2] = (at + 1).ravel()
    cut[1::2] = ends.ravel()
    pieces = pa.StringArray.from_buffers(len(cut) - 1, pa.py_buffer(cut), texts.buffers()[2])
    return UniformProperties(n, names, pieces, ends > at + 1)


def _same_bytes(data: np.ndarray, starts: np.ndarray, want: np.ndarray) -> bool:
    """data[s:s + len(want)] == want for every s of `starts` (each s + len(want) inside
    data): 8 bytes a gather, read as one unaligned 64-bit word per row, instead of an
    index per byte."""
    length = len(want)
    span = -(-length // 8) * 8                   # the words read from each start
    if length > 8 * 8 or int(starts.max()) + span > len(data):
        got = np.lib.stride_tricks.sliding_window_view(data, length)[starts]
        return bool((got == want).all())
    words = at_every_byte(data, "<u8")
    padded = np.zeros(span, np.uint8)
    padded[:length] = want
    for w in range(0, length, 8):
        keep = min(8, length - w)
        mask = np.uint64((1 << (8 * keep)) - 1)
        if not ((words[starts + w] & mask) == padded[w:w + 8].view("<u8")[0]).all():
            return False
    return True


def properties_columns(texts: pa.Array) -> Properties | UniformProperties:
    """Properties texts (one per row) -> their lookups and user map: UniformProperties when
    every row has the same entries, else Properties."""
    return uniform_properties(texts) or Properties(texts)


def _has_duplicate_names(offsets: pa.Array, names: pa.Array) -> bool:
    """Whether some row's entries repeat a name (rows of one entry cannot)."""
    lists = pa.ListArray.from_arrays(offsets, names)
    if pc.max(pc.list_value_length(lists)).as_py() <= 1:
        return False
    pairs = pa.table({"row": pc.list_parent_indices(lists), "name": names})
    return pairs.group_by(["row", "name"]).aggregate([]).num_rows < len(names)


def _user_map_plain(texts: list[str]) -> pa.MapArray:
    """The user-properties map column row by row (decode_properties' dict order): the
    reference properties_columns is pinned to, and its path for rows repeating a name."""
    system = SYSTEM_PROPERTY_KEYS
    offsets = [0]
    keys: list[str] = []
    vals: list[str] = []
    for text in texts:
        for k, v in decode_properties(text).items():
            if k not in system:
                keys.append(k)
                vals.append(v)
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(vals, pa.string()))


def records_to_batch(records, broker_name: str, columns: tuple[str, ...] | None = None) -> pa.RecordBatch:
    """decode_records_raw tuples -> one RecordBatch of ARROW_SCHEMA. `records` is a list of
    tuples or a list of such lists (the pulls of one batch: each is transposed on its own,
    which keeps the C-level zip(*records) in the CPU cache). The fields are handed to
    pyarrow as columns; the properties texts of all rows are parsed at once by
    pyarrow.compute (properties_columns: tags, keys, UNIQ_KEY and the user map from it).
    Python steps per row remain only for the hosts (one dict lookup each) and for the
    offset msg id of rows without a UNIQ_KEY. `columns` (schema.projection): only these, in
    that order (made from the whole row here: this is the path of the rare records the
    column-wise one leaves out)."""
    cols = _columns(records)
    n = len(cols[0])
    if not n:
        return _empty(columns)
    props = properties_columns(pa.array(cols[4], pa.string()))
    msg_ids = props.lookup(UNIQ_KEY)
    if msg_ids.null_count:
        missing = pc.is_null(msg_ids)
        store_hosts, clo = cols[11], cols[7]
        fallback = [offset_msg_id(store_hosts[i][0], store_hosts[i][1], clo[i])
                    for i in pc.indices_nonzero(missing).to_pylist()]
        msg_ids = pc.replace_with_mask(msg_ids, missing, pa.array(fallback, pa.string()))
    hosts = {h: format_host(h[0], h[1]) for h in set(cols[9])}
    ts = pa.timestamp("us", tz="UTC")
    ms = pa.timestamp("ms", tz="UTC")
    arrays = [
        pa.array(cols[0], pa.string()),
        pa.repeat(pa.scalar(broker_name, pa.string()), n),
        pa.array(cols[2], pa.int32()),
        pa.array(cols[3], pa.int64()),
        msg_ids,
        props.lookup(TAGS),
        props.lookup(KEYS),
        pa.array(cols[1], pa.binary()),
        props.user_map(),
        pa.array(cols[8], pa.int64()).cast(ms).cast(ts),
        pa.array(cols[10], pa.int64()).cast(ms).cast(ts),
        pa.array(list(map(hosts.__getitem__, cols[9])), pa.string()),
        pa.array(cols[12], pa.int32()),
    ]
    batch = pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
    if columns is None:
        return batch
    # not RecordBatch.select: pyarrow < 12 lacks it
    return pa.RecordBatch.from_arrays([batch.column(c) for c in columns], schema=arrow_schema(columns))


def _empty(columns: tuple[str, ...] | None) -> pa.RecordBatch:
    schema = arrow_schema(columns)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _columns(records) -> list:
    """Records (or lists of records) -> 16 column lists."""
    if not records or type(records[0]) is tuple:
        records = [records]
    cols: list = [[] for _ in range(16)]
    for part in records:
        if part:
            for col, values in zip(cols, zip(*part)):
                col.extend(values)
    return cols


async def _pulls(inst, r: QueueRange, offset: int, sub_expression: str, rows: int) -> tuple[str, list[PullResult]]:
    """Pulls of `r` from `offset` on, in one coroutine (one hop to the client's loop for
    several pulls): until about `rows` records came, the range's end, or a result the caller
    must judge (not FOUND / NO_MATCHED_MSG, no progress, the queue's min past the offset).
    The bodies come undecoded (PULL_BODY): (the broker's address, the results)."""
    mq = MessageQueue(r.topic, r.broker_name, r.queue_id)
    addr = await inst.master_addr_refreshing(r.broker_name, r.topic)
    out = []
    got = 0
    while True:
        res = await inst.api.pull_message(PullRequest(
            addr, READ_GROUP, mq, offset, min(PULL_BATCH, r.end - offset), pull_sys_flag(False, False, True), 0, 0,
            sub_expression, 0, PULL_TIMEOUT_S, raw=PULL_BODY))
        out.append(res)
        nxt = res.next_begin_offset
        got += nxt - offset     # the records a body holds, without walking it here (on the loop)
        if (res.status not in _GO_ON or nxt <= offset or nxt >= r.end or got >= rows
                or res.min_offset > offset):
            return addr, out
        offset = nxt


_GO_ON = (PullResult.FOUND, PullResult.NO_MATCHED_MSG)


def read_range(namesrv_addr: str, r: QueueRange, sub_expression: str, fail_on_data_loss: bool,
               columns: tuple[str, ...] | None = None, credentials=None, tls: bool = False):
    """Yield RecordBatches of the messages of `r` (exactly [start, end), tag-filtered), about
    BATCH_ROWS rows each (Arrow's and Spark's costs per batch are fixed: few large batches),
    made READ_AHEAD batches ahead by a thread while Spark consumes the previous ones.
    `columns` (schema.projection): only these columns, in that order (None: every one)."""
    batches = (batch for parts in pull_range(namesrv_addr, r, sub_expression, fail_on_data_loss,
                                              credentials=credentials, tls=tls)
               for batch in parts_to_batches(parts, r.broker_name, columns))
    return read_ahead(batches, READ_AHEAD)


READ_AHEAD = 2
_END = object()


def read_ahead(items, depth: int):
    """Yield what the iterator `items` yields, computed by a thread up to `depth` items
    ahead: the Spark worker's main thread spends its time writing batches to the JVM (the
    GIL released), which the next pull and conversion can use. An exception of `items` is
    raised here, in order; closing this generator stops the thread after its current item."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def produce():
        try:
            for item in items:
                q.put((item, None))
                if stop.is_set():
                    return
            q.put((_END, None))
        except BaseException as e:      # handed to the consumer, which raises it
            if not stop.is_set():
                q.put((_END, e))

    threading.Thread(target=produce, name="pocketmq-read-ahead", daemon=True).start()
    try:
        while True:
            item, error = q.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        # a consumer that stops early: free a slot so a blocked put returns, and the
        # producer sees `stop` after it (it puts at most one more item)
        stop.set()
        while True:
            try:
                q.get_nowait()
            except queue.Empty:
                break


def pull_range(namesrv_addr: str, r: QueueRange, sub_expression: str, fail_on_data_loss: bool,
               rows: int | None = None, credentials=None, tls: bool = False):
    """Yield the records of `r` (exactly [start, end), tag-filtered) in batches of about
    `rows` (BATCH_ROWS) records, each a list of non-empty segments in queue order
    (ColumnSegment, or lists of decode_records_raw tuples for the records the column-wise
    path leaves out: _body_segments): read_range without the Arrow step (bench_spark times it).
    The next batch's pulls run on the client's loop while this one is decoded (one batch
    ahead at most): they start where this batch's last pull ended, and are cancelled and
    asked again when judging this batch moves the offset elsewhere (data loss skipped)."""
    from pocketmq.spark.session import submit_with_instance

    wanted = tag_set(sub_expression)
    rows = rows or BATCH_ROWS
    mq = MessageQueue(r.topic, r.broker_name, r.queue_id)

    def pulls(offset: int):
        return offset, submit_with_instance(namesrv_addr, lambda inst: _pulls(inst, r, offset, sub_expression, rows),
                                            credentials=credentials, tls=tls)

    ahead = pulls(r.start) if r.start < r.end else None
    try:
        while ahead is not None:
            offset, future = ahead
            addr, results = future.result(PULLS_TIMEOUT_S)
            ahead = None
            last = results[-1]
            if last.status in _GO_ON and last.next_begin_offset < r.end:
                ahead = pulls(last.next_begin_offset)       # where the batch after this one starts
            parts, offset = _batch_parts(results, r, offset, wanted, fail_on_data_loss, mq, addr)
            if ahead is not None and ahead[0] != offset:
                ahead[1].cancel()
                ahead = None
            if ahead is None and offset < r.end:
                ahead = pulls(offset)
            if parts:
                yield parts
    finally:
        if ahead is not None:
            ahead[1].cancel()


# The longest wait for one batch's pulls (each pull has its own PULL_TIMEOUT_S).
PULLS_TIMEOUT_S = 120.0


def _batch_parts(results: list[PullResult], r: QueueRange, offset: int, wanted, fail_on_data_loss: bool,
                 mq: MessageQueue, addr: str) -> tuple[list, int]:
    """The pull results of one batch (in order, the first at `offset`) -> (their segments cut
    to r and the tag filter, the next offset): each body by _body_segments and _judge, or all
    at once by _joined_segment when that applies (the same answer: _judge would keep every
    body whole)."""
    joined = _joined_segment(results, r, offset, wanted)
    if joined is not None:
        return [joined], results[-1].next_begin_offset
    parts = []
    for res in results:
        segments = _body_segments(res.body, mq, addr) if res.body is not None else None
        keep, offset = _judge(res, r, offset, wanted, fail_on_data_loss, segments)
        parts.extend(keep)
    return parts, offset


# Bodies joined for one _frame at most (the batch's bodies are held anyway; the join copies
# them once, and _frame's offsets are int32).
JOIN_BYTES_MAX = 64 << 20


def _joined_segment(results: list[PullResult], r: QueueRange, offset: int, wanted) -> ColumnSegment | None:
    """The records of all the batch's pull bodies as one ColumnSegment, framed by one _frame
    over their joined bytes, when _judge would keep every body whole: every result FOUND with
    a body of column-wise records only (record_starts_np, no slow record), each body's first
    record at the offset its pull asked for (no gap: no data-loss decision) and its last
    before the range's end, no tag filter, progress on every pull. None otherwise (the caller
    takes each body on its own; nothing here raises or logs). Why: each body's walk and
    _frame cost ~75 µs of numpy and pyarrow calls whatever its rows, about a third of a 256
    KiB body's decode; joined, the batch pays them once (docs/benchmarks.md, issue 35 item 4,
    seventeenth session)."""
    if wanted is not None or not results:
        return None
    bodies = []
    starts = []
    size = 0
    for res in results:
        body = res.body
        if res.status != PullResult.FOUND or body is None or res.next_begin_offset <= offset:
            return None
        walked = record_starts_np(body)
        if walked is None or len(walked[1]) or not len(walked[0]):
            return None
        st = walked[0]
        first, last = queue_offset_at(body, int(st[0])), queue_offset_at(body, int(st[-1]))
        if first != offset or last >= r.end:
            return None
        bodies.append(body)
        starts.append(st + size if size else st)
        size += len(body)
        if size > JOIN_BYTES_MAX:
            return None
        offset = res.next_begin_offset
    if len(bodies) == 1:
        return _frame(bodies[0], starts[0])
    return _frame(b"".join(bodies), np.concatenate(starts))


def _judge(res: PullResult, r: QueueRange, offset: int, wanted, fail_on_data_loss: bool,
           segments: list | None = None) -> tuple[list, int]:
    """One pull result at `offset`: (its segments cut to r and the tag filter, the next
    offset); `segments` are the result's records (default: res.records as one segment).
    Raises on data loss (failOnDataLoss) and on a pull that contradicts the plan."""
    if res.status == PullResult.OFFSET_ILLEGAL or (res.min_offset > offset and res.status != PullResult.FOUND):
        if res.min_offset > offset:
            msg = data_loss_message(r.topic, r.broker_name, r.queue_id, offset, res.min_offset)
            if fail_on_data_loss:
                raise DataLossError(msg)
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            return [], res.min_offset
        raise RuntimeError(f"pocketmq: offset {offset} of {r.topic} {r.broker_name} queue {r.queue_id} "
                           f"is illegal (queue holds {res.min_offset}..{res.max_offset})")
    if res.status == PullResult.NO_NEW_MSG:
        # the range was planned below the max offset: nothing new means the data vanished
        raise RuntimeError(f"pocketmq: {r.topic} {r.broker_name} queue {r.queue_id} has no message at "
                           f"offset {offset} (max {res.max_offset}) though {r.end} was planned")
    if segments is None:
        segments = [res.records]
    segments = [seg for seg in segments if len(seg)]
    keep: list = []
    if segments:
        first = _queue_offset(segments[0], 0)
        if first > offset and wanted is None:
            # with `*` the broker skips nothing: a gap is data that retention deleted
            msg = data_loss_message(r.topic, r.broker_name, r.queue_id, offset, first)
            if fail_on_data_loss:
                raise DataLossError(msg)
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
        for seg in segments:
            seg = _cut(seg, offset, r.end, wanted)
            if len(seg):
                keep.append(seg)
    if res.next_begin_offset <= offset:
        raise RuntimeError(f"pocketmq: pull of {r.topic} {r.broker_name} queue {r.queue_id} at {offset} "
                           f"made no progress ({res})")
    return keep, res.next_begin_offset


def _queue_offset(seg, i: int) -> int:
    return int(seg.queue_offset[i]) if type(seg) is ColumnSegment else seg[i][3]


def _cut(seg, offset: int, end: int, wanted):
    """The records of a segment in [offset, end) whose TAGS are wanted (None: all)."""
    if type(seg) is ColumnSegment:
        qo = seg.queue_offset
        mask = None
        if not (qo[0] >= offset and qo[-1] < end):
            mask = (qo >= offset) & (qo < end)
        if wanted is not None:
            tagged = np.fromiter((_tags_of(t) in wanted for t in seg.props.to_pylist()), bool, len(qo))
            mask = tagged if mask is None else mask & tagged
        return seg if mask is None else seg.filter(mask)
    if seg[0][3] >= offset and seg[-1][3] < end:
        kept = seg          # one queue's records come in offset order: all inside
    else:
        kept = [t for t in seg if end > t[3] >= offset]
    if wanted is not None:
        kept = [t for t in kept if _tags_of(t[4]) in wanted]
    return kept


def _tags_of(props_text: str) -> str | None:
    # the broker filters by tag hash code only (RocketMQ's rule); the exact check is the client's
    return property_value(props_text, TAGS) if props_text else None


# -- column-wise: pull bodies straight into Arrow ------------------------------------------

_P = head_positions(0)      # the layout of the records record_starts leaves to this path
assert _P["born_port"] == _P["born_host"] + 4 and _P["store_port"] == _P["store_host"] + 4
# A record's fixed head (TOTALSIZE .. BODYLENGTH) as one numpy record: the fields the reader
# uses, big-endian at head_positions(0); hosts as one 8-byte key (address + port, unsigned).
_HEAD_FIELDS = (("total_size", ">i4"), ("queue_id", ">i4"), ("queue_offset", ">i8"),
                ("physical_offset", ">i8"), ("born_timestamp", ">i8"), ("born_host", ">u8"),
                ("store_timestamp", ">i8"), ("store_host", ">u8"), ("reconsume_times", ">i4"),
                ("body_length", ">i4"))
_HEAD = np.dtype({"names": [f for f, _ in _HEAD_FIELDS], "formats": [t for _, t in _HEAD_FIELDS],
                  "offsets": [_P[f] for f, _ in _HEAD_FIELDS], "itemsize": _P["body"]})


def _heads(arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The fixed heads of the records at `starts` (each with at least a head's bytes after
    it: record_starts' fast records), as _HEAD records: one row copy per record out of a
    sliding-window view of the body (no index per byte)."""
    window = np.lib.stride_tricks.sliding_window_view(arr, _HEAD.itemsize)
    return np.ascontiguousarray(window[starts]).view(_HEAD).ravel()


def _field(heads: np.ndarray, name: str) -> np.ndarray:
    """One head field of every record as a native array (the big-endian bytes swapped)."""
    col = heads[name]
    return col.astype(col.dtype.newbyteorder("="))


class ColumnSegment:
    """Records of one pull body decoded column-wise (_frame): Arrow arrays for the variable
    parts, numpy arrays for the fixed fields (hosts as one 8-byte key: address + port)."""
    __slots__ = ("topic", "body", "props", "queue_id", "queue_offset", "commit_log_offset", "born_timestamp",
                 "born_host", "store_timestamp", "store_host", "reconsume_times")

    def __len__(self) -> int:
        return len(self.queue_offset)

    def filter(self, mask: np.ndarray) -> ColumnSegment:
        out = ColumnSegment()
        keep = pa.array(mask)
        for name in self.__slots__:
            col = getattr(self, name)
            setattr(out, name, col.filter(keep) if isinstance(col, pa.Array) else col[mask])
        return out


def _body_segments(body: bytes, mq: MessageQueue, addr: str) -> list:
    """A FOUND pull body -> its records as segments in queue order: ColumnSegment for the
    runs of records record_starts leaves to the column-wise path, decode_records_raw tuples
    for the others (compressed, IPv6 hosts, odd ones: decode_pull_body decompresses, or
    skips them with the client's log). A body whose framing or UTF-8 is off anywhere is
    decoded whole by decode_pull_body, as pull_message would have (its error or salvage)."""
    walked = record_starts_np(body)
    if walked is not None:
        starts, slow = walked
        bounds = starts.tolist() + [len(body)]
        segments: list = []
        prev = 0
        for i in slow.tolist() + [len(starts)]:
            if i > prev:
                cols = _frame(body, starts[prev:i])
                if cols is None:
                    break
                segments.append(cols)
            if i < len(starts):
                records = decode_pull_body(body[bounds[i]:bounds[i + 1]], mq, addr)
                if records:
                    segments.append(records)
            prev = i + 1
        else:
            return segments
    records = decode_pull_body(body, mq, addr)
    return [records] if records else []


def _frame(body: bytes, starts: list[int]) -> ColumnSegment | None:
    """The columns of the records at `starts` of `body` (laid out as head_positions(0), each
    inside the body: record_starts' fast records), with decode_records_raw's checks made
    vectorised; None when any record's framing or text is off (the caller decodes the body
    record by record then). Body, topic and properties are each cut out of the body by
    _cut_out (one `take` over a zero-copy array of the body's bytes)."""
    arr = np.frombuffer(body, np.uint8)
    st = np.asarray(starts, np.int64)
    heads = _heads(arr, st)                     # one gather: every fixed field is a column of it
    end = st + _field(heads, "total_size")
    body_len = _field(heads, "body_length")
    body_start = st + _P["body"]
    body_end = body_start + body_len
    if not ((body_len >= 0) & (body_end + 3 <= end)).all():
        return None
    topic_len = arr[body_end].astype(np.int64)          # TOPICLENGTH: one signed byte
    topic_start = body_end + 1
    topic_end = topic_start + topic_len
    if not ((topic_len <= TOPIC_LENGTH_BYTES_MAX) & (topic_end + 2 <= end)).all():
        return None
    # PROPERTIESLENGTH, a signed short: one gather from the body viewed as big-endian int16s
    props_len = at_every_byte(arr, ">i2")[topic_end].astype(np.int64)
    props_start = topic_end + 2
    if not ((props_len >= 0) & (props_start + props_len == end)).all():
        return None
    data = pa.py_buffer(body)
    c = ColumnSegment()
    try:
        c.topic = _cut_out(data, topic_start, topic_end).view(pa.string())
        c.topic.validate(full=True)
        c.props = _cut_out(data, props_start, end).view(pa.string())
        c.props.validate(full=True)
    except pa.ArrowInvalid:             # not UTF-8
        return None
    c.body = _cut_out(data, body_start, body_end)
    c.queue_id = _field(heads, "queue_id")
    c.queue_offset = _field(heads, "queue_offset")
    c.commit_log_offset = _field(heads, "physical_offset")
    c.born_timestamp = _field(heads, "born_timestamp")
    c.born_host = _field(heads, "born_host")      # address and port: one key
    c.store_timestamp = _field(heads, "store_timestamp")
    c.store_host = _field(heads, "store_host")
    c.reconsume_times = _field(heads, "reconsume_times")
    return c


def _cut_out(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.BinaryArray:
    """data[starts[i]:ends[i]] for each i (ascending, non-overlapping ranges) as one binary
    array: a `take` of every other value of a zero-copy array whose values alternate range /
    gap to the next range. One array per column rather than one holding every field: `take`
    sizes its output as the mean value length times the values taken, and over one shared
    array of six pieces a record that mean is a sixth of a record, so the body's and the
    properties' outputs grew by reallocation, copied twice more (0.134 against 0.089 µs a
    row for the three columns; docs/benchmarks.md, issue 35 item 4, nineteenth session).
    Here it is half a record, at least the range's own length unless the range is most of
    its record."""
    n = len(starts)
    if not n:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int32)
    bounds[0::2] = starts
    bounds[1::2] = ends
    pieces = pa.BinaryArray.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), data])
    return pieces.take(pa.array(np.arange(0, 2 * n - 1, 2)))


def _host(key) -> tuple[bytes, int]:
    """An 8-byte host key (IPv4 address, int port) -> (address bytes, port)."""
    b = int(key).to_bytes(8, "big")
    return b[:4], int.from_bytes(b[4:], "big", signed=True)


def segments_to_batch(segments: list[ColumnSegment], broker_name: str,
                      columns: tuple[str, ...] | None = None) -> pa.RecordBatch:
    """ColumnSegments (in queue order) -> one RecordBatch of ARROW_SCHEMA, the same as
    records_to_batch gives for the same records (tests/spark/test_columnar.py pins it).
    `columns` (schema.projection): only these, in that order; the others are not computed
    (no properties parsing unless msg_id, tags, keys or properties is asked for)."""
    def col(name):
        parts = [getattr(s, name) for s in segments]
        if len(parts) == 1:
            return parts[0]
        return pa.concat_arrays(parts) if isinstance(parts[0], pa.Array) else np.concatenate(parts)

    n = sum(len(s) for s in segments)
    if not n:
        return _empty(columns)
    parsed = []         # the batch's Properties, parsed once when a column needs them

    def props() -> Properties | UniformProperties:
        if not parsed:
            parsed.append(properties_columns(col("props")))
        return parsed[0]

    def msg_ids():
        ids = props().lookup(UNIQ_KEY)
        if ids.null_count:
            missing = pc.is_null(ids)
            store_hosts, clo = col("store_host"), col("commit_log_offset")
            fallback = [offset_msg_id(*_host(store_hosts[i]), int(clo[i]))
                        for i in pc.indices_nonzero(missing).to_numpy()]
            ids = pc.replace_with_mask(ids, missing, pa.array(fallback, pa.string()))
        return ids

    def born_hosts():
        born = col("born_host")
        if (born == born[0]).all():
            return pa.repeat(pa.scalar(format_host(*_host(born[0])), pa.string()), n)
        keys, which = np.unique(born, return_inverse=True)
        return pa.array([format_host(*_host(k)) for k in keys], pa.string()).take(which)

    def timestamps(name):
        return pa.array(col(name), pa.int64()).cast(_MS).cast(_TS)

    make = {
        "topic": lambda: col("topic"),
        "broker_name": lambda: pa.repeat(pa.scalar(broker_name, pa.string()), n),
        "queue_id": lambda: pa.array(col("queue_id"), pa.int32()),
        "queue_offset": lambda: pa.array(col("queue_offset"), pa.int64()),
        "msg_id": msg_ids,
        "tags": lambda: props().lookup(TAGS),
        "keys": lambda: props().lookup(KEYS),
        "body": lambda: col("body"),
        "properties": lambda: props().user_map(),
        "born_timestamp": lambda: timestamps("born_timestamp"),
        "store_timestamp": lambda: timestamps("store_timestamp"),
        "born_host": born_hosts,
        "reconsume_times": lambda: pa.array(col("reconsume_times"), pa.int32()),
    }
    schema = arrow_schema(columns)
    return pa.RecordBatch.from_arrays([make[name]() for name in schema.names], schema=schema)


_MS = pa.timestamp("ms", tz="UTC")
_TS = pa.timestamp("us", tz="UTC")


def parts_to_batches(parts: list, broker_name: str, columns: tuple[str, ...] | None = None):
    """A batch's segments (pull_range) -> RecordBatches in queue order: each run of
    ColumnSegments by segments_to_batch, each run of tuple lists by records_to_batch;
    `columns` as theirs."""
    run: list = []
    for seg in parts:
        if run and (type(seg) is ColumnSegment) != (type(run[0]) is ColumnSegment):
            yield _run_batch(run, broker_name, columns)
            run = []
        run.append(seg)
    if run:
        yield _run_batch(run, broker_name, columns)


def _run_batch(run: list, broker_name: str, columns: tuple[str, ...] | None) -> pa.RecordBatch:
    if type(run[0]) is ColumnSegment:
        return segments_to_batch(run, broker_name, columns)
    return records_to_batch(run, broker_name, columns)
