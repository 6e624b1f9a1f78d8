"""A read's cost in the remoting layer, in-process: `Connection.data_received` of one whole
frame, as a sync send's two reads are.

    python bench/bench_reads.py [--number 50000] [--repeat 15]

  client reply     a ClientConnection reads a send's reply (msgpack header, 5 ext fields,
                   no body) and resolves the request's future
  server request   a server Connection (a processor table, the broker's shape) reads a
                   SEND_MESSAGE_V2 (msgpack header, 12 ext fields, 128 B body) and queues a
                   prebuilt reply for its one write

No sockets: the transport is a stub that drops what is written. µs per read, the minimum
over --repeat runs of --number reads (the minimum: this host's noise only adds).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.client.connection import ClientConnection  # noqa: E402
from pocketmq.protocol.codes import CURRENT_VERSION, LanguageCode, RequestCode, SerializeType  # noqa: E402
from pocketmq.protocol.command import RemotingCommand, encode  # noqa: E402
from pocketmq.remoting.connection import Connection  # noqa: E402


class _Transport:
    def get_extra_info(self, name):
        return None

    def writelines(self, parts):
        pass

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0


def read_costs(number: int, repeat: int) -> dict:
    async def run():
        loop = asyncio.get_running_loop()
        st = SerializeType.MSGPACK
        client = ClientConnection()
        client.connection_made(_Transport())
        reply = encode(RemotingCommand(0, 5, 1, None, {
            "msgId": "7F00000100002A9F0000000000123456", "queueId": "0", "queueOffset": "12345",
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}, b"", LanguageCode.JAVA, CURRENT_VERSION, st))

        last = []

        def client_reply():
            fut = client.pending[5] = loop.create_future()
            client.data_received(reply)
            last[:] = [fut]

        ext = {"a": "G", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000000",
               "h": "0", "j": "0", "k": "false", "m": "false",
               "i": "WAIT\x01true\x02UNIQ_KEY\x017F0000010000000000000000000000AB"}
        req = RemotingCommand(RequestCode.SEND_MESSAGE_V2, 7, 0, None, ext, b"x" * 128,
                              LanguageCode.PYTHON, CURRENT_VERSION, st)
        request = encode(req)
        answer = req.response(0, None, {"queueOffset": "1"})
        handled = [0]

        def process(conn, cmd):
            handled[0] += 1
            return answer
        server = Connection(processors={RequestCode.SEND_MESSAGE_V2: process},
                            pause_reading_on_backpressure=True)
        server.connection_made(_Transport())

        def server_request():
            server.data_received(request)

        out = {}
        for name, fn in (("client_reply", client_reply), ("server_request", server_request)):
            fn()
            out[name + "_us"] = min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6
        # what was timed did the work: every request handled, every reply matched
        if handled[0] != 1 + number * repeat or last[0].result().ext_fields["queueOffset"] != "12345":
            raise AssertionError(f"reads not handled: {handled[0]} requests, reply {last[0]}")
        if client.pending or client.closed or server.closed:
            raise AssertionError("a connection closed or a request left pending")
        return out
    return asyncio.run(run())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=50000)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    for k, v in read_costs(args.number, args.repeat).items():
        print(f"{k:20} {v:.2f}")


if __name__ == "__main__":
    main()
