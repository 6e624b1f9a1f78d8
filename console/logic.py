"""The console's rules, sans-IO: lag, lag history, the reset preview, scan bounds,
pagination, the few-seconds cache, time and body rendering. Plain functions of their
inputs (the clock comes in as `now_ms`); console/data.py and console/app.py are the shells
that fetch and serve.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict, deque
from datetime import datetime, timezone
from typing import NamedTuple

# -- lag ---------------------------------------------------------------------------------------

NO_OFFSET_YET = "no offset yet"


def queue_lag(broker_offset: int, consumer_offset: int | None) -> int | None:
    """Messages of one queue the group has not consumed. None when the group has no
    committed offset there (rocketmq-dashboard shows -1: the lag is unknown, not negative).
    A consumer offset past the broker's (a queue truncated or reset under it) is lag 0."""
    if consumer_offset is None or consumer_offset < 0:
        return None
    return max(0, broker_offset - consumer_offset)


def total_lag(lags) -> int | None:
    """Sum over the queues that have an offset; None when none has one."""
    known = [x for x in lags if x is not None]
    return sum(known) if known else None


def lag_text(lag: int | None) -> str:
    return NO_OFFSET_YET if lag is None else str(lag)


def sort_groups_by_lag(rows, lag_of) -> list:
    """Largest lag first; groups with no offset yet after every group with a number, then by name."""
    return sorted(rows, key=lambda r: (lag_of(r) is None, -(lag_of(r) or 0), str(r)))


# -- orderly state ----------------------------------------------------------------------------

def client_orderly(properties: dict) -> bool | None:
    """Whether a client consumes orderly, from its running info's PROP_CONSUMEORDERLY
    ("true"/"false"; the C++ client writes "flase"); None when it does not say."""
    v = str(properties.get("PROP_CONSUMEORDERLY", "")).strip().lower()
    if v == "true":
        return True
    if v in ("false", "flase"):
        return False
    return None


def orderly_text(config_orderly: bool, clients) -> str:
    """A group's orderly state as the pages show it: what its online clients report
    (`clients`: one True/False/None per client), then the broker's subscription group
    config when it asks for orderly consumption (RocketMQ 5's consumeMessageOrderly, which
    POP consumers follow). "-" with neither."""
    clients = list(clients)
    known = [c for c in clients if c is not None]
    parts = []
    if known:
        n = sum(known)
        parts.append("orderly" if n == len(known) else "concurrently" if n == 0
                     else f"mixed: {n} of {len(known)} clients orderly")
        if len(known) < len(clients):
            parts[-1] += f" ({len(clients) - len(known)} not telling)"
    elif clients:
        parts.append("unknown (no client tells)")
    if config_orderly:
        parts.append("group config: orderly")
    return " · ".join(parts) or "-"


class LagHistory:
    """Per-group (now_ms, total lag) samples over the last `window_ms`, sampled by the console
    process (a broker keeps no lag history). Bounded: `max_points` per group (older points
    dropped) and `max_groups` groups (the group sampled least recently is forgotten first)."""

    def __init__(self, window_ms: int = 3_600_000, max_points: int = 720, max_groups: int = 2000):
        if window_ms <= 0 or max_points <= 0 or max_groups <= 0:
            raise ValueError("LagHistory: window_ms, max_points and max_groups must be positive")
        self.window_ms = window_ms
        self.max_points = max_points
        self.max_groups = max_groups
        self._series: OrderedDict[str, deque] = OrderedDict()

    def add(self, group: str, now_ms: int, lag: int | None) -> None:
        s = self._series.get(group)
        if s is None:
            if len(self._series) >= self.max_groups:
                self._series.popitem(last=False)
            s = self._series[group] = deque(maxlen=self.max_points)
        else:
            self._series.move_to_end(group)
        s.append((now_ms, lag))
        self._trim(s, now_ms)

    def _trim(self, s: deque, now_ms: int) -> None:
        while s and s[0][0] < now_ms - self.window_ms:
            s.popleft()

    def series(self, group: str, now_ms: int) -> list[tuple[int, int | None]]:
        s = self._series.get(group)
        if s is None:
            return []
        self._trim(s, now_ms)
        return list(s)

    def groups(self) -> list[str]:
        return list(self._series)


def chart_data(points) -> dict:
    """uPlot's columns: x in seconds, y the lag (null where there was no offset yet)."""
    return {"x": [t / 1000 for t, _ in points], "lag": [lag for _, lag in points]}


# -- reset offsets -----------------------------------------------------------------------------

RESET_MODES = ("earliest", "latest", "time")


def reset_timestamp_ms(mode: str, time_ms: int | None) -> int:
    """The timestamp INVOKE_BROKER_TO_RESET_OFFSET takes for a mode: earliest = 0 (the broker's
    time search answers each queue's min offset), latest = -1 (the max offsets), time = it."""
    if mode == "earliest":
        return 0
    if mode == "latest":
        return -1
    if mode == "time":
        if time_ms is None or time_ms < 0:
            raise ValueError("reset by time needs a time")
        return time_ms
    raise ValueError(f"unknown reset mode {mode!r} (earliest, latest or time)")


class PreviewRow(NamedTuple):
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    current: int | None      # None: no offset yet
    target: int | None       # None: not moved (no offset yet)
    change: int              # target - current (negative: replayed, positive: skipped)
    effect: str              # "replay N", "skip N", "unchanged", "start at N"


def reset_target(mode: str, min_offset: int, max_offset: int, searched: int | None) -> int:
    """Where a queue's offset goes: the queue's ends, or the offset the broker's time search
    found, clamped into [min, max] (as the broker clamps it)."""
    if mode == "earliest":
        return min_offset
    if mode == "latest":
        return max_offset
    if searched is None:
        raise ValueError("reset by time needs the searched offset of each queue")
    return min(max(searched, min_offset), max_offset)


def preview_row(broker_name: str, queue_id: int, min_offset: int, max_offset: int, current: int | None,
                target: int) -> PreviewRow:
    if current is None or current < 0:
        # the broker moves only committed offsets: a queue without one is left alone
        return PreviewRow(broker_name, queue_id, min_offset, max_offset, None, None, 0, "not moved: no offset yet")
    change = target - current
    if change < 0:
        effect = f"replay {-change}"
    elif change > 0:
        effect = f"skip {change}"
    else:
        effect = "unchanged"
    return PreviewRow(broker_name, queue_id, min_offset, max_offset, current, target, change, effect)


def preview_totals(rows) -> tuple[int, int]:
    """(messages replayed, messages skipped) over the preview's queues."""
    replay = sum(-r.change for r in rows if r.change < 0)
    skip = sum(r.change for r in rows if r.change > 0)
    return replay, skip


# -- scans -------------------------------------------------------------------------------------

MAX_SCAN_MESSAGES = 1_000_000     # no content search reads more than this, whatever is asked
DEFAULT_SCAN_MESSAGES = 100_000
MAX_SCAN_HITS = 200


class ScanRange(NamedTuple):
    broker_name: str
    queue_id: int
    first: int
    stop: int        # exclusive


def scan_plan(ranges, limit: int) -> tuple[list[ScanRange], bool]:
    """Share a scan budget of `limit` messages over queue ranges [first, stop): each queue gets
    an equal share of what is left (the newest messages of a queue when its share is short,
    the most likely wanted), unused shares going to the queues that need more. Returns the
    bounded ranges and whether anything was cut."""
    if limit <= 0:
        raise ValueError("scan limit must be positive")
    limit = min(limit, MAX_SCAN_MESSAGES)
    rs = sorted((r for r in ranges if r.stop > r.first), key=lambda r: r.stop - r.first)
    out, left = [], limit
    cut = False
    for i, r in enumerate(rs):
        share = left // (len(rs) - i) if i < len(rs) else 0
        n = r.stop - r.first
        take = min(n, share)
        if take < n:
            cut = True
        if take > 0:
            out.append(ScanRange(r.broker_name, r.queue_id, r.stop - take, r.stop))
        left -= take
    out.sort(key=lambda r: (r.broker_name, r.queue_id))
    return out, cut


def in_time_range(store_ms: int, begin_ms: int | None, end_ms: int | None) -> bool:
    """Inside [begin, end] (either end open when None)."""
    return (begin_ms is None or store_ms >= begin_ms) and (end_ms is None or store_ms <= end_ms)


def scan_total(plan) -> int:
    return sum(r.stop - r.first for r in plan)


def message_matches(body: bytes, properties: dict, needle: str, prop_key: str | None) -> bool:
    """A content search's test: a property equal to `needle` (prop_key given), else the body
    containing the needle's UTF-8 bytes (a body need not be text)."""
    if prop_key:
        return properties.get(prop_key) == needle
    return needle.encode("utf-8") in body


# -- pagination --------------------------------------------------------------------------------

MAX_PER_PAGE = 200


class Page(NamedTuple):
    items: list
    page: int
    pages: int
    total: int
    per_page: int


def paginate(items, page: int, per_page: int = 50) -> Page:
    """One page of `items` (1-based; a page past the end shows the last one)."""
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    total = len(items)
    pages = max(1, math.ceil(total / per_page))
    page = min(max(1, page), pages)
    start = (page - 1) * per_page
    return Page(list(items[start:start + per_page]), page, pages, total, per_page)


def search_names(names, query: str) -> list[str]:
    """Case-insensitive substring match, sorted."""
    q = (query or "").strip().lower()
    return sorted(n for n in names if q in n.lower())


# -- cache -------------------------------------------------------------------------------------

class TtlCache:
    """Answers kept `ttl_ms` (a page viewed by several people, or reloaded, costs the cluster
    one round of requests per few seconds); at most `max_entries` kept, oldest dropped."""

    def __init__(self, ttl_ms: int = 3000, max_entries: int = 1024):
        self.ttl_ms = ttl_ms
        self.max_entries = max_entries
        self._d: OrderedDict = OrderedDict()

    def get(self, key, now_ms: int):
        hit = self._d.get(key)
        if hit is None or now_ms - hit[0] >= self.ttl_ms:
            return None
        return hit[1]

    def put(self, key, value, now_ms: int) -> None:
        self._d[key] = (now_ms, value)
        self._d.move_to_end(key)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()


# -- time and bodies ---------------------------------------------------------------------------

def parse_local_time(text: str | None, tz=None) -> int | None:
    """An <input type=datetime-local> value ("2024-05-01T10:30", seconds optional) or
    milliseconds -> epoch ms; None for empty. ValueError names the expected forms."""
    if text is None or not text.strip():
        return None
    t = text.strip()
    if t.isdigit():
        return int(t)
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"bad time {text!r}: use YYYY-MM-DDTHH:MM[:SS] or milliseconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()
    return int(dt.timestamp() * 1000)


def format_ms(ms: int | None, tz=None) -> str:
    if not ms or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz or timezone.utc).astimezone(tz).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def body_views(body: bytes, max_bytes: int = 65536) -> dict:
    """The body as text (UTF-8, invalid bytes replaced), hex (16 bytes a line) and pretty JSON
    when it parses; only the first `max_bytes` are shown (`cut` says so)."""
    shown = body[:max_bytes]
    text = shown.decode("utf-8", errors="replace")
    lines = []
    for i in range(0, len(shown), 16):
        chunk = shown[i:i + 16]
        lines.append(f"{i:08x}  {chunk.hex(' '):<47}  " + "".join(chr(b) if 32 <= b < 127 else "." for b in chunk))
    pretty = None
    try:
        pretty = json.dumps(json.loads(body.decode("utf-8")), indent=2, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError):
        pass
    return {"text": text, "hex": "\n".join(lines), "json": pretty, "size": len(body), "cut": len(body) > max_bytes}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def uptime_text(ms: int) -> str:
    s = max(0, ms // 1000)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}d {h}h {m}m" if d else f"{h}h {m}m {s}s"


# -- ACL ---------------------------------------------------------------------------------------

ACL_PERMS = ("DENY", "PUB", "SUB", "PUB|SUB")


def acl_config_from_form(form: dict) -> dict:
    """The ACL page's account form -> UPDATE_AND_CREATE_ACL_CONFIG's config, checked by the ACL
    owner's own rules (common/acl.py build_account: key lengths, the white address forms) and
    the permission names; ValueError names what is wrong. Resource permissions are "name=PERM"
    comma lists; the broker checks their form again and answers 209 with Java's message."""
    from pocketmq.common.acl import build_account

    def text(k):
        v = str(form.get(k) or "").strip()
        return v or None

    def perms(k):
        v = text(k)
        return [p.strip() for p in v.split(",") if p.strip()] if v else None
    cfg = {"accessKey": text("accessKey"), "secretKey": text("secretKey"),
           "whiteRemoteAddress": text("whiteRemoteAddress"), "admin": form.get("admin") in ("on", "true", True),
           "defaultTopicPerm": text("defaultTopicPerm") or "DENY",
           "defaultGroupPerm": text("defaultGroupPerm") or "SUB",
           "topicPerms": perms("topicPerms"), "groupPerms": perms("groupPerms")}
    for k in ("defaultTopicPerm", "defaultGroupPerm"):
        if cfg[k] not in ACL_PERMS:
            raise ValueError(f"{k} must be one of {', '.join(ACL_PERMS)}")
    for k in ("topicPerms", "groupPerms"):
        for item in cfg[k] or ():
            name, _, perm = item.partition("=")
            if not name.strip() or perm.strip() not in ACL_PERMS:
                raise ValueError(f"{k}: {item!r} is not name=PERM with PERM one of {', '.join(ACL_PERMS)}")
    build_account(cfg)
    return cfg


def public_account(acc: dict) -> dict:
    """An account as a page may show it: everything but the secret key."""
    return {k: v for k, v in acc.items() if k != "secretKey"}
