"""Pure text formatting for `mqadmin` (no I/O, no network): aligned tables,
timestamps, permissions, topic configs, message views, route JSON.

Output follows RocketMQ's mqadmin where it has a fixed shape (column titles
starting with `#`, `Label:` lines for a message) but columns are sized to
their content instead of fixed printf widths, so long names stay aligned.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence

COLUMN_GAP = 2


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def format_table(headers: Sequence[str], rows: Iterable[Sequence], *, right: Iterable[int] = (),
                 gap: int = COLUMN_GAP) -> str:
    """Left-aligned columns (indexes in `right` right-aligned), one space-separated
    line per row, no trailing blanks. Every row must have len(headers) cells."""
    head = [str(h) for h in headers]
    body = []
    for r in rows:
        cells = [_cell(c) for c in r]
        if len(cells) != len(head):
            raise ValueError(f"row has {len(cells)} cells, table has {len(head)} columns")
        body.append(cells)
    widths = [len(h) for h in head]
    for cells in body:
        for i, c in enumerate(cells):
            widths[i] = max(widths[i], len(c))
    right_set = set(right)
    sep = " " * gap

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            out.append(c.rjust(widths[i]) if i in right_set else c.ljust(widths[i]))
        return sep.join(out).rstrip()

    return "\n".join([line(head)] + [line(c) for c in body])


def format_kv_lines(pairs: Iterable[tuple[str, object]], *, label_width: int = 20) -> str:
    """`Label:              value` lines like RocketMQ's printf("%-20s %s")."""
    return "\n".join(f"{(k + ':').ljust(label_width)} {_cell(v)}".rstrip() for k, v in pairs)


def human_ms(ms: int | None) -> str:
    """Local time `yyyy-MM-dd HH:mm:ss,SSS` (Java UtilAll.timeMillisToHumanString2); "" for <= 0."""
    if not ms or ms <= 0:
        return ""
    secs, milli = divmod(int(ms), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(secs)) + f",{milli:03d}"


def perm_string(perm: int) -> str:
    """PermName.perm2String: R/W/X (inherit) or '-' for each bit."""
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-") + ("X" if perm & 1 else "-")


def topic_config_line(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int,
                      topic_filter_type: str = "SINGLE_TAG", topic_sys_flag: int = 0,
                      order: bool = False) -> str:
    return (f"TopicConfig [topicName={topic}, readQueueNums={read_queue_nums}, "
            f"writeQueueNums={write_queue_nums}, perm={perm_string(perm)}, "
            f"topicFilterType={topic_filter_type}, topicSysFlag={topic_sys_flag}, "
            f"order={'true' if order else 'false'}]")


def format_properties(props: Mapping[str, str]) -> str:
    """`{K1=v1, K2=v2}` like a Java Map's toString, keys sorted for stable output."""
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(props.items())) + "}"


def decode_body(body: bytes, charset: str = "utf-8") -> str:
    """Body text for display; undecodable bytes shown as \\xNN escapes."""
    return body.decode(charset, errors="backslashreplace")


def format_message(msg, offset_msg_id: str, charset: str = "utf-8") -> str:
    """The queryMsgById view of a decoded record (protocol.message.MessageExt)."""
    props = msg.properties
    return format_kv_lines([
        ("OffsetID", offset_msg_id),
        ("Topic", msg.topic),
        ("Tags", f"[{props.get('TAGS', '')}]"),
        ("Keys", f"[{props.get('KEYS', '')}]"),
        ("Queue ID", msg.queue_id),
        ("Queue Offset", msg.queue_offset),
        ("CommitLog Offset", msg.commit_log_offset),
        ("Reconsume Times", msg.reconsume_times),
        ("Born Timestamp", human_ms(msg.born_timestamp)),
        ("Store Timestamp", human_ms(msg.store_timestamp)),
        ("Born Host", msg.born_host),
        ("Store Host", msg.store_host),
        ("System Flag", msg.sys_flag),
        ("Properties", format_properties(props)),
        ("Message Body", decode_body(msg.body, charset)),
    ])


def message_queue_string(topic: str, broker_name: str, queue_id: int) -> str:
    """Java's MessageQueue.toString."""
    return f"MessageQueue [topic={topic}, brokerName={broker_name}, queueId={queue_id}]"


def message_line(msg, charset: str = "utf-8") -> str:
    """One message as Java's printMessage prints it (consumeMessage, printMsg):
    `MSGID: <id> MessageExt [...] BODY: <body>`; the body as text, not Java's byte array."""
    props = format_properties(msg.properties)
    return (f"MSGID: {msg.msg_id} MessageExt [brokerName={msg.broker_name}, queueId={msg.queue_id}, "
            f"storeSize={msg.store_size}, queueOffset={msg.queue_offset}, sysFlag={msg.sys_flag}, "
            f"bornTimestamp={msg.born_timestamp}, bornHost={msg.born_host}, "
            f"storeTimestamp={msg.store_timestamp}, storeHost={msg.store_host}, msgId={msg.offset_msg_id}, "
            f"commitLogOffset={msg.commit_log_offset}, bodyCRC={msg.body_crc}, "
            f"reconsumeTimes={msg.reconsume_times}, preparedTransactionOffset={msg.prepared_transaction_offset}, "
            f"topic={msg.topic}, flag={msg.flag}, properties={props}] BODY: {decode_body(msg.body, charset)}")


def _json_ready(v):
    """Make lenient-parser output (tuple keys from object-keyed maps) dumpable."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if isinstance(k, tuple):
                k = json.dumps(dict(k), sort_keys=True, separators=(",", ":"))
            out[str(k)] = _json_ready(x)
        return out
    if isinstance(v, list):
        return [_json_ready(x) for x in v]
    return v


def format_json(obj) -> str:
    """Pretty JSON (4-space indent, sorted keys, non-ASCII kept)."""
    return json.dumps(_json_ready(obj), indent=4, sort_keys=True, ensure_ascii=False)


def format_command_list(commands: Iterable[tuple[str, str]]) -> str:
    items = list(commands)
    width = max((len(n) for n, _ in items), default=0)
    lines = ["usage: mqadmin <command> [<args>]", "",
             "The most commonly used mqadmin commands are:"]
    lines += [f"   {n.ljust(width)}  {d}" for n, d in items]
    lines += ["", "See 'mqadmin help <command>' for more information on a specific command."]
    return "\n".join(lines)
