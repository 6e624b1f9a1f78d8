"""The committed gRPC modules (broker/proxy/pb) against the .proto files they were generated
from, and a few wire facts of apache/rocketmq-apis v2 the official clients depend on."""
from __future__ import annotations

import hashlib
import pathlib

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy.pb import POOL, _source, definition_pb2 as d, service_pb2 as s  # noqa: E402

PROTOS = pathlib.Path(__file__).resolve().parents[2] / "broker" / "proxy" / "protos"


def test_generated_modules_match_the_proto_files():
    for name, digest in _source.PROTO_SHA256.items():
        assert hashlib.sha256((PROTOS / name).read_bytes()).hexdigest() == digest, (
            f"{name} changed since broker/proxy/pb was generated: run broker/proxy/protos/generate.py "
            f"with {_source.GENERATOR}")
    assert sorted(_source.PROTO_SHA256) == sorted(p.name for p in PROTOS.glob("*.proto"))


def test_messaging_service_has_the_17_rpcs_of_rocketmq_apis():
    svc = s.DESCRIPTOR.services_by_name["MessagingService"]
    assert svc.full_name == "apache.rocketmq.v2.MessagingService"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in svc.methods}
    assert len(methods) == 17
    assert methods["ReceiveMessage"] == (False, True)
    assert methods["PullMessage"] == (False, True)
    assert methods["Telemetry"] == (True, True)
    assert methods["SendMessage"] == (False, False)
    for name in ("QueryRoute", "Heartbeat", "QueryAssignment", "AckMessage", "ForwardMessageToDeadLetterQueue",
                 "UpdateOffset", "GetOffset", "QueryOffset", "EndTransaction", "NotifyClientTermination",
                 "ChangeInvisibleDuration", "RecallMessage", "SyncLiteSubscription"):
        assert name in methods


@pytest.mark.parametrize("message,field,number", [
    ("SystemProperties", "message_group", 17), ("SystemProperties", "delivery_timestamp", 11),
    ("SystemProperties", "receipt_handle", 12), ("SystemProperties", "delivery_attempt", 16),
    ("SystemProperties", "body_digest", 4), ("Message", "body", 4), ("Message", "user_properties", 2),
    ("Settings", "publishing", 5), ("Settings", "subscription", 6), ("Settings", "user_agent", 7),
    ("Publishing", "max_body_size", 2), ("Subscription", "long_polling_timeout", 5),
    ("MessageQueue", "accept_message_types", 5), ("RetryPolicy", "customized_backoff", 3),
])
def test_definition_field_numbers(message, field, number):
    assert d.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_service_field_numbers_and_codes():
    tc = s.DESCRIPTOR.message_types_by_name["TelemetryCommand"]
    assert tc.fields_by_name["recover_orphaned_transaction_command"].number == 5
    assert tc.fields_by_name["settings"].number == 2
    assert s.DESCRIPTOR.message_types_by_name["SendResultEntry"].fields_by_name["transaction_id"].number == 3
    assert d.Code.Value("OK") == 20000 and d.Code.Value("TOPIC_NOT_FOUND") == 40402
    assert d.Code.Value("MESSAGE_NOT_FOUND") == 40401 and d.Code.Value("INVALID_RECEIPT_HANDLE") == 40013
    assert d.Code.Value("NOT_IMPLEMENTED") == 50100 and d.Code.Value("TOO_MANY_REQUESTS") == 42900
    assert d.Language.Value("PYTHON") == 6 and d.ClientType.Value("SIMPLE_CONSUMER") == 3


def test_descriptors_live_in_pocketmqs_own_pool():
    from google.protobuf import descriptor_pool
    assert POOL.FindMessageTypeByName("apache.rocketmq.v2.Message") is d.Message.DESCRIPTOR
    with pytest.raises(KeyError):   # the official client registers these names there
        descriptor_pool.Default().FindMessageTypeByName("apache.rocketmq.v2.Message")
