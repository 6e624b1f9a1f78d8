"""A gone auto-renew owner's leases (broker/core/pop.py `PopState.owned_by`, used by
broker/services/pop.py `release_owner`): found by owner, brought forward by `reschedule`,
and then due (a FIFO queue they blocked gives its batch again) — the rest untouched."""
from __future__ import annotations

import types

import pytest

from pocketmq.broker.core.pop import FifoStep, PopState, fifo_step

KEY = ("g", "T", 0)


def test_owned_leases_brought_forward_become_due_and_unblock_the_fifo_queue():
    s = PopState()
    mine = s.lease(KEY, [(0, 100, 1), (1, 200, 1)], 1000, 60_000, fifo=True, ck_pos=0, ck_offset=0,
                   owner="client-A", renew_until=1000 + 3_600_000, next_offset=2)
    other = s.lease(("g", "T", 1), [(0, 300, 1)], 1000, 60_000, fifo=True, ck_pos=0, ck_offset=0,
                    owner="client-B", renew_until=1000 + 3_600_000, next_offset=1)
    plain = s.lease(("g", "T", 2), [(0, 400, 1)], 1000, 60_000, fifo=False, ck_pos=0, ck_offset=0, next_offset=1)
    assert s.owned_by("client-A") == mine and s.owned_by("client-B") == other and s.owned_by("nobody") == []
    q = s.queue(KEY)
    assert fifo_step(q, None, 5000) is FifoStep.BLOCKED
    for lease in mine:                      # what release_owner does at now = 5000
        s.reschedule(lease, 6000)
    assert s.due(5999, 10) == []
    assert s.due(6000, 10) == mine          # the old 61 s entries are stale, these are due
    assert fifo_step(q, None, 6000) is FifoStep.REDELIVER
    assert s.find(KEY, 0, 1000) is mine[0]  # the same lease: its handle is not made stale
    assert s.next_due() == 61_000 and {x.key for x in s.due(61_000, 10)} == {("g", "T", 1), ("g", "T", 2)}
    assert plain[0].owner is None



def test_a_consumers_settings_keep_it_an_owner():
    """A consumer's Telemetry settings (its stream opened or reopened) mark its client id
    alive for the POP engine, so leases brought forward by a broken stream are renewed
    again; a producer's settings do not."""
    pytest.importorskip("grpc", reason="the grpc extra is not installed")
    from pocketmq.broker.core.clients import ConsumerManager, ProducerManager
    from pocketmq.broker.proxy import service as svc
    from pocketmq.broker.proxy.pb import definition_pb2 as pb

    kept: list = []
    pop = types.SimpleNamespace(keep_owner=kept.append, release_owner=lambda owner: None)
    ctx = types.SimpleNamespace(mono_ms=lambda: 0, now_ms=lambda: 0, consumers=ConsumerManager(),
                                producers=ProducerManager(), groups=types.SimpleNamespace(find=lambda g, now=0: None),
                                pop=pop, config=types.SimpleNamespace(maxMessageSize=4 << 20), delay_levels=[1000])
    s = svc.MessagingService(ctx, {}, grpc_port=8081, advertised_host="127.0.0.1")
    consumer = svc.GrpcChannel("consumer-1", "10.0.0.7:1", s)
    s._take_settings(consumer, pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name="G"))))
    producer = svc.GrpcChannel("producer-1", "10.0.0.7:2", s)
    s._take_settings(producer, pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()))
    assert kept == ["consumer-1"]
