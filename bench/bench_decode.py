"""Pull-body decode benchmark: the client CPU per record of turning a PULL response body into
the messages a consumer receives, in-process.

    python bench/bench_decode.py [--records 32] [--body 128] [--number 20000] [--repeat 5]
                                 [--reference OLD_MESSAGE_PY]

Builds one pull body of `--records` records as the broker stores them (IPv4 hosts, a
`--body`-byte body, UNIQ_KEY and WAIT properties, one topic) and times:

  decode_messages   what the consumers call (views of the body for the common record)
  general loop      the loop a record of another layout takes (an 18-field MessageExt per
                    record, every check), run over the same body
  + read body/offset/msg_id   decode_messages, then each message's body, queue_offset and
                    msg_id read once (what a typical listener touches)

`--reference FILE` times another version of protocol/message.py the same way, in the same
process (loaded under another module name), e.g. the one before the views:

    git show b0d2bc6:protocol/message.py > /tmp/message_b0d2bc6.py
    python bench/bench_decode.py --reference /tmp/message_b0d2bc6.py

Best of `--repeat` timeit runs of `--number` calls, in µs per record; the calibration line
is the CPU cost of one no-op Python call right now: read the figures against it.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.protocol import message as msgcodec  # noqa: E402


def pull_body(records: int, body_size: int) -> bytes:
    props = msgcodec.encode_properties({"UNIQ_KEY": "7F00000100002A9F0000000000000000", "WAIT": "true"})
    born, store = (bytes([10, 0, 0, 7]), 50000), (bytes([127, 0, 0, 1]), 10911)
    body = os.urandom(body_size)
    return b"".join(msgcodec.encode_record("BenchTopic", 0, 0, body, props, 0, 1_700_000_000_000 + i, born,
                                           store, 0, 0, i, 1000 + i * 300, 1_700_000_000_100 + i)
                    for i in range(records))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--body", type=int, default=128)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--reference", metavar="FILE", help="another version of protocol/message.py to time alongside")
    a = ap.parse_args()
    buf = pull_body(a.records, a.body)
    decode = msgcodec.decode_messages
    general = msgcodec._decode_pull_body
    assert decode(buf, "b") == general(buf, True, "b")

    def reads(decode_fn):
        """decode_fn, then each message's body, queue_offset and msg_id read once."""
        def run():
            for m in decode_fn(buf, "b"):
                m.body, m.queue_offset, m.msg_id
        return run

    cases = [("decode_messages", lambda: decode(buf, "b")),
             ("general loop", lambda: general(buf, True, "b")),
             ("decode_messages + read body/offset/msg_id", reads(decode))]
    if a.reference:
        spec = importlib.util.spec_from_file_location("_bench_reference_message", a.reference)
        ref = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = ref  # dataclasses look their module up while the class is built
        spec.loader.exec_module(ref)
        ref_decode = ref.decode_messages
        # the same messages, or the comparison means nothing
        fields = ("topic", "queue_id", "queue_offset", "commit_log_offset", "body", "properties",
                  "born_timestamp", "store_timestamp", "msg_id", "reconsume_times")
        assert ([[getattr(m, f) for f in fields] for m in ref_decode(buf, "b")]
                == [[getattr(m, f) for f in fields] for m in decode(buf, "b")])
        cases += [("reference decode_messages", lambda: ref_decode(buf, "b")),
                  ("reference + read body/offset/msg_id", reads(ref_decode))]
    calib = min(timeit.repeat(lambda: None, number=a.number * 10, repeat=a.repeat)) / (a.number * 10)
    print(f"calibration: {calib * 1e9:.0f} ns per no-op Python call")
    for name, fn in cases:
        best = min(timeit.repeat(fn, number=a.number, repeat=a.repeat)) / a.number
        print(f"{name:42s} {best / a.records * 1e6:6.2f} µs per record "
              f"({best * 1e6:7.1f} µs per {a.records}-record body of {a.body} B)")


if __name__ == "__main__":
    main()
