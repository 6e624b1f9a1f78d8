"""The gRPC service's client table (broker/proxy/service.py) with in-memory collaborators:
its bound, expiry of silent clients, and what closing a client undoes."""
from __future__ import annotations

import types

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.core.clients import CHANNEL_EXPIRED_MS, ConsumerManager, ProducerManager  # noqa: E402
from pocketmq.broker.proxy import service as svc  # noqa: E402
from pocketmq.broker.proxy.convert import Code, Refused  # noqa: E402
from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


class Context:
    """What grpc.aio hands a handler, as far as the service reads it."""

    def __init__(self, client_id):
        self.client_id = client_id

    def invocation_metadata(self):
        return (("x-mq-client-id", self.client_id),) if self.client_id else ()

    def peer(self):
        return "ipv4:10.0.0.7:40000"


@pytest.fixture
def service(monkeypatch):
    monkeypatch.setattr(svc, "MAX_CLIENTS", 3)
    clock = Clock()
    groups = types.SimpleNamespace(find=lambda group, now=0: None)
    pop = types.SimpleNamespace(released=[])
    pop.release_owner = pop.released.append
    ctx = types.SimpleNamespace(mono_ms=clock, now_ms=clock, consumers=ConsumerManager(), producers=ProducerManager(),
                                groups=groups, pop=pop)
    s = svc.MessagingService(ctx, {}, grpc_port=8081, advertised_host="127.0.0.1")
    s.clock = clock
    return s


def test_client_table_is_bounded_and_silent_clients_make_room(service):
    for i in range(3):
        service._channel(Context(f"c{i}"))
    with pytest.raises(Refused) as e:
        service._channel(Context("c3"))
    assert e.value.code == Code.TOO_MANY_REQUESTS
    service.clock.now += CHANNEL_EXPIRED_MS // 2
    service._channel(Context("c0"))                     # c0 speaks again
    service.clock.now += CHANNEL_EXPIRED_MS // 2 + 1    # c1 and c2 are silent past the expiry
    ch = service._channel(Context("c3"))
    assert ch.remote_addr == "10.0.0.7:40000"
    assert sorted(service.clients) == ["c0", "c3"]


def test_a_client_with_a_telemetry_stream_is_not_expired(service):
    for i in range(3):
        service._channel(Context(f"c{i}"))
    service.clients["c1"].outbox = object()             # a live stream
    service.clock.now += CHANNEL_EXPIRED_MS + 1
    service._channel(Context("c3"))
    assert sorted(service.clients) == ["c1", "c3"]


def test_missing_client_id_is_refused(service):
    with pytest.raises(Refused) as e:
        service._channel(Context(None))
    assert e.value.code == Code.CLIENT_ID_REQUIRED


def test_closing_a_client_unregisters_it(service):
    ch = service._channel(Context("p1"))
    ch.client_type = pb.PRODUCER
    ch.topics = ("T1", "T2")
    service._register(ch)
    assert set(service.ctx.producers.groups) == {"T1", "T2"}
    info = service.ctx.producers.groups["T1"][ch]
    assert (info.protocol, info.client_type, info.client_id) == ("grpc", "PRODUCER", "p1")
    ch.close()
    assert service.ctx.producers.groups == {} and "p1" not in service.clients
    assert ch.push(object()) is False                   # nothing is queued for a closed client
    assert service.ctx.pop.released == ["p1"]           # its auto-renewed leases are renewed no more
