"""Prometheus plumbing both daemons share: request latency per request code, the
`/metrics` HTTP endpoint, and a latency histogram cheap enough for the request path.

Cost on the request path: nothing unless metrics are on (`metricsPort` set). Then each
processor of the server's table is wrapped by `timed_table`: two perf_counter reads,
one bisect and two additions per request (the histogram per code is made once, when
the table is built); a processor answering later (a coroutine) is timed until its
answer; a pull parked for long polling until it is parked. prometheus_client's own
Histogram is not used on this path (it takes a lock per observation); its output
format is produced at scrape time by `RequestLatencyCollector` from our counts.

The endpoint runs on the daemon's event loop (`serve_metrics`, asyncio): a scrape
reads the live tables on the loop thread, so no table is read while the loop changes
it, and nothing blocks: collecting is in-memory work.
"""
from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from time import perf_counter

from pocketmq.protocol.codes import RequestCode
from pocketmq.protocol.command import RemotingCommand

log = logging.getLogger("pocketmq.metrics")

# seconds; le bounds of every latency histogram (Prometheus adds +Inf)
LATENCY_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyHistogram:
    """Counts per bucket (the last one is +Inf) and the sum, in seconds. Written by one
    thread (the loop, or the flush thread), read at scrape time."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, +Inf last: prometheus_client's HistogramMetricFamily input."""
        out, total = [], 0
        for bound, n in zip(LATENCY_BOUNDS, self.counts):
            total += n
            out.append((repr(bound), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out


class RequestLatency:
    """One LatencyHistogram per request code a server serves."""

    def __init__(self) -> None:
        self.by_code: dict[int, LatencyHistogram] = {}

    def histogram(self, code: int) -> LatencyHistogram:
        h = self.by_code.get(code)
        if h is None:
            h = self.by_code[code] = LatencyHistogram()
        return h


def timed_table(table: dict, latency: RequestLatency) -> dict:
    """The processor table `table` (code -> proc(conn, cmd)) with every processor timed."""
    return {code: _timed(fn, latency.histogram(code)) for code, fn in table.items()}


def _timed(fn, h: LatencyHistogram):
    # LatencyHistogram.observe inlined for the synchronous answers (most requests): one
    # call less per request.
    counts, bounds = h.counts, LATENCY_BOUNDS

    def timed(conn, cmd):
        t0 = perf_counter()
        try:
            result = fn(conn, cmd)
        except BaseException:
            h.observe(perf_counter() - t0)
            raise
        if result is None or type(result) is RemotingCommand:
            d = perf_counter() - t0
            counts[bisect_left(bounds, d)] += 1
            h.sum += d
            return result
        return _timed_answer(result, t0, h.observe)
    return timed


async def _timed_answer(awaitable, t0: float, observe):
    try:
        return await awaitable
    finally:
        observe(perf_counter() - t0)


def code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


def histogram_family(name: str, doc: str, labels: list[str]):
    from prometheus_client.core import HistogramMetricFamily
    return HistogramMetricFamily(name, doc, labels=labels)


class RequestLatencyCollector:
    """pocketmq_request_latency_seconds{code, request}: the server's RequestLatency."""

    def __init__(self, latency: RequestLatency, role: str) -> None:
        self.latency = latency
        self.role = role

    def collect(self):
        fam = histogram_family("pocketmq_request_latency_seconds",
                               f"Time the {self.role} spent answering a request, per request code", ["code", "request"])
        for code, h in sorted(self.latency.by_code.items()):
            counts = h.counts
            if not any(counts):
                continue
            fam.add_metric([str(code), code_name(code)], h.buckets(), h.sum)
        yield fam


# -- the /metrics endpoint ------------------------------------------------------------------
HEADER_BYTES_MAX = 8192
READ_TIMEOUT_S = 10.0


async def serve_metrics(host: str, port: int, registry) -> asyncio.AbstractServer:
    """Serve `registry` (a prometheus_client CollectorRegistry) at GET /metrics on
    host:port. Returns the started server (close it with .close(); await .wait_closed())."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].split()
            method = parts[0] if parts else b""
            path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
            if method not in (b"GET", b"HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET /metrics\n"
            elif path != b"/metrics":
                status, ctype, body = "404 Not Found", "text/plain", b"metrics are at /metrics\n"
            else:
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(registry)
            writer.write((f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                          f"Connection: close\r\n\r\n").encode())
            if method != b"HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        except Exception:
            log.exception("serving /metrics failed")
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=HEADER_BYTES_MAX, reuse_address=True)


def bound_port(server: asyncio.AbstractServer) -> int:
    return server.sockets[0].getsockname()[1]
