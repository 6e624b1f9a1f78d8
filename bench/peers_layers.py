"""Two experiment columns for ../shared/bench/peers.py: pocketmq's broker driven by the
harness's own minimal client (FrameClient), to see how much of the pocketmq column's sync
cell is the client's (`--phases layers` of bench_client measures the same without the
harness; docs/benchmarks.md, "What each layer of the client costs a sync send").

  pocketmq-frame   a prebuilt SEND_MESSAGE_V2 frame per body size: no client work at all
  pocketmq-codec   the frame encoded per send and the reply decoded into a SendResult

The sync and window cells go through the layer (window: 64 frames in flight, one request
each, none coalesced); the batch and consume cells are the pocketmq column's own, run
again. Run with the pocketmq column and a peer:

    python ../shared/bench/peers.py --extra bench/peers_column.py --extra bench/peers_layers.py \
        --pin same --only redis-streams,pocketmq-frame,pocketmq-codec,pocketmq --no-limits
"""
import importlib.util
import os
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))


def make_targets(api):
    from bench.bench_client import send_layer_fns
    spec = importlib.util.spec_from_file_location("peers_column_for_layers",
                                                  os.path.join(BENCH_DIR, "peers_column.py"))
    column = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(column)
    PocketMQ = type(next(t for t in column.make_targets(api) if t.name == "pocketmq"))

    class Layer(PocketMQ):
        def __init__(self, name, layer):
            super().__init__(name, settings=f"sync sends through the `{layer}` layer on peers.py's "
                                            "FrameClient (bench_client --phases layers)")
            self.layer = layer

        async def connect(self):
            await super().connect()
            import asyncio
            _, self.raw = await asyncio.get_running_loop().create_connection(
                api.FrameClient, "127.0.0.1", self.broker_port)
            self.fns = {}

        async def send_one(self, body):
            fn = self.fns.get(len(body))
            if fn is None:
                fn = self.fns[len(body)] = (await send_layer_fns(self.p, self.raw.request, self.topic, body))[self.layer]
            await fn()

        async def close(self):
            raw = getattr(self, "raw", None)      # (connect() may have failed before it)
            if raw is not None and raw.t is not None:
                raw.t.close()
            await super().close()

        async def extra_sections(self, ctx):
            return []

    return [Layer("pocketmq-frame", "frame"), Layer("pocketmq-codec", "codec")]
