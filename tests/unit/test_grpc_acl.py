"""Plain ACL on the gRPC endpoint: the `authorization` header and its signature
(broker/proxy/auth.py), the resources of each RPC and the decision (common/acl.py
`grpc_resources`, `check_grpc`), and the guard's answers and deny records.

The signature vectors were computed independently with
`printf '%s' DATE | openssl dgst -sha1 -hmac SECRET`; the first header is what the official
Python client 5.1.2 sent (captured from a stub server's invocation metadata, credentials
AKcapture1 / SKsecret12345).
"""
from __future__ import annotations

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy import auth  # noqa: E402
from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2 as spb  # noqa: E402
from pocketmq.common import acl as A  # noqa: E402
from pocketmq.remoting.acl import AclService, acl_metrics  # noqa: E402

CAPTURED = ("MQv2-HMAC-SHA1 Credential=AKcapture1, SignedHeaders=x-mq-date-time, "
            "Signature=5b91206b72c37c4652f81fa16ce7eb23624ab676")
CAPTURED_DATE = "20261128T134234Z"

# (secret, date-time, openssl's hex)
VECTORS = [
    ("SKsecret12345", "20261128T134234Z", "5b91206b72c37c4652f81fa16ce7eb23624ab676"),
    ("12345678", "20240101T000000Z", "c6fc09021280e20533c17364f135c0e3217d83e9"),
    ("sécret-clé", "20250615T123045Z", "f1f68b87e0a600e346d266e38f313a5b118e2da4"),
]


# --- the header -------------------------------------------------------------------------------

def test_the_captured_header_parses_and_verifies():
    ak, sig = auth.parse_authorization(CAPTURED)
    assert ak == "AKcapture1"
    assert sig == bytes.fromhex("5b91206b72c37c4652f81fa16ce7eb23624ab676")
    assert auth.signature_matches("SKsecret12345", CAPTURED_DATE, sig)
    assert not auth.signature_matches("SKsecret12346", CAPTURED_DATE, sig)
    assert not auth.signature_matches("SKsecret12345", "20261128T134235Z", sig)


@pytest.mark.parametrize("secret,date,hexsig", VECTORS)
def test_signature_vectors(secret, date, hexsig):
    assert auth.sign(secret, date) == hexsig
    assert auth.signature_matches(secret, date, bytes.fromhex(hexsig))
    # Java decodes the hex in either case
    _, upper = auth.parse_authorization(f"MQv2-HMAC-SHA1 Credential=k, Signature={hexsig.upper()}")
    assert auth.signature_matches(secret, date, upper)


def test_header_items_as_java_reads_them():
    # Credential's first "/" part; items trimmed; unknown items and the method word ignored
    assert auth.parse_authorization("X Credential=AK1/2024/region,Signature=00ff , Extra=1") == ("AK1", b"\x00\xff")
    # a missing Signature or Credential is None (refused later: no key / bad signature)
    assert auth.parse_authorization("MQv2-HMAC-SHA1 Credential=AK1") == ("AK1", None)
    assert auth.parse_authorization("MQv2-HMAC-SHA1 Signature=00") == (None, b"\x00")
    # the empty credentials the clients send with no ACL configured
    assert auth.parse_authorization("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=00") \
        == (None, b"\x00")


@pytest.mark.parametrize("value,words", [
    (None, "missing"),
    ("", "missing"),
    ("MQv2-HMAC-SHA1", "incorrect"),
    (" Credential=AK", "incorrect"),
    ("MQv2-HMAC-SHA1 Credential", "not key=value"),
    ("MQv2-HMAC-SHA1 Credential=AK, Signature=zz", "not hex"),
    ("MQv2-HMAC-SHA1 Credential=AK, Signature=abc", "not hex"),
    ("MQv2-HMAC-SHA1 Credential=" + "A" * 5000, "longer than"),
])
def test_malformed_headers_are_refused_with_a_reason(value, words):
    with pytest.raises(auth.AuthorizationError, match=words):
        auth.parse_authorization(value)


def test_a_missing_signature_never_matches():
    assert not auth.signature_matches("12345678", "20240101T000000Z", None)
    assert not auth.signature_matches("12345678", "\ud800", b"\x00" * 20)     # no client signs that


# --- the resources of each RPC ------------------------------------------------------------------

def R(name):
    return pb.Resource(name=name)


def settings_pub(*topics):
    return spb.TelemetryCommand(settings=pb.Settings(publishing=pb.Publishing(topics=[R(t) for t in topics])))


def settings_sub(group, *topics):
    return spb.TelemetryCommand(settings=pb.Settings(subscription=pb.Subscription(
        group=R(group), subscriptions=[pb.SubscriptionEntry(topic=R(t)) for t in topics])))


MQ = pb.MessageQueue(topic=R("T"))
RESOURCES = [
    ("SendMessage", spb.SendMessageRequest(messages=[pb.Message(topic=R("T")), pb.Message(topic=R("T"))]),
     {"T": A.PUB}),
    ("SendMessage", spb.SendMessageRequest(messages=[pb.Message(topic=R("T")), pb.Message(topic=R("U"))]),
     {"T": A.PUB, "U": A.PUB}),
    ("EndTransaction", spb.EndTransactionRequest(topic=R("T")), {"T": A.PUB}),
    ("RecallMessage", spb.RecallMessageRequest(topic=R("T")), {"T": A.PUB}),
    ("ReceiveMessage", spb.ReceiveMessageRequest(group=R("G"), message_queue=MQ), {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("AckMessage", spb.AckMessageRequest(group=R("G"), topic=R("T")), {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(group=R("G"), topic=R("T")),
     {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueRequest(group=R("G"), topic=R("T")),
     {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("QueryAssignment", spb.QueryAssignmentRequest(group=R("G"), topic=R("T")), {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("PullMessage", spb.PullMessageRequest(group=R("G"), message_queue=MQ), {"%RETRY%G": A.SUB, "T": A.SUB}),
    ("QueryOffset", spb.QueryOffsetRequest(message_queue=MQ), {"T": A.SUB}),
    ("QueryRoute", spb.QueryRouteRequest(topic=R("T")), {"T": A.ANY}),
    ("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER), {}),
    ("Heartbeat", spb.HeartbeatRequest(client_type=pb.PUSH_CONSUMER, group=R("G")), {"%RETRY%G": A.SUB}),
    ("Heartbeat", spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=R("G")), {"%RETRY%G": A.SUB}),
    ("NotifyClientTermination", spb.NotifyClientTerminationRequest(), {}),
    ("NotifyClientTermination", spb.NotifyClientTerminationRequest(group=R("G")), {"%RETRY%G": A.SUB}),
    ("Telemetry", settings_pub("T", "U"), {"T": A.PUB, "U": A.PUB}),
    ("Telemetry", settings_sub("G", "T", "U"), {"%RETRY%G": A.SUB, "T": A.SUB, "U": A.SUB}),
    ("Telemetry", spb.TelemetryCommand(thread_stack_trace=spb.ThreadStackTrace()), {}),
    ("Telemetry", None, {}),
]


@pytest.mark.parametrize("rpc,request_,expected", RESOURCES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RESOURCES)])
def test_resources_of_each_rpc(rpc, request_, expected):
    assert A.grpc_resources(rpc, request_) == expected


def test_every_served_rpc_has_a_mapping():
    requests = {"Telemetry": spb.TelemetryCommand()}
    for rpc in auth.UNARY_RPCS + auth.STREAM_RPCS:
        requests.setdefault(rpc, getattr(spb, f"{rpc}Request")())
    for rpc, req in requests.items():
        if rpc in ("Heartbeat", "Telemetry"):
            continue
        A.grpc_resources(rpc, req)        # no ValueError: every RPC is known
    with pytest.raises(ValueError, match="unknown"):
        A.grpc_resources("Nope", spb.QueryRouteRequest())


@pytest.mark.parametrize("rpc,request_,words", [
    ("Heartbeat", spb.HeartbeatRequest(client_type=pb.PUSH_CONSUMER), "doesn't have group"),
    ("Telemetry", spb.TelemetryCommand(settings=pb.Settings()), "publishing or subscription"),
])
def test_requests_java_cannot_parse(rpc, request_, words):
    with pytest.raises(ValueError, match=words):
        A.grpc_resources(rpc, request_)


# --- the decision --------------------------------------------------------------------------------

ACL_YML = b"""\
globalWhiteRemoteAddresses: [10.9.9.*]
accounts:
  - accessKey: pubOnly1
    secretKey: pubSecret1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [orders=PUB, audit=SUB]
    groupPerms: [G1=SUB]
  - accessKey: whiteAcct
    secretKey: whiteSecret
    whiteRemoteAddress: 192.168.7.*
  - accessKey: admin001
    secretKey: adminSecret
    admin: true
"""


@pytest.fixture
def table():
    return A.build_table([A.parse_acl_file(ACL_YML, "plain_acl.yml")])


def good(secret):
    return lambda s: s == secret


def send(topic):
    return spb.SendMessageRequest(messages=[pb.Message(topic=R(topic))])


def test_allowed_with_the_right_key_and_permission(table):
    assert A.check_grpc(table, "SendMessage", send("orders"), "pubOnly1", good("pubSecret1"), "1.2.3.4") is None
    assert A.check_grpc(table, "QueryRoute", spb.QueryRouteRequest(topic=R("audit")), "pubOnly1",
                        good("pubSecret1"), "1.2.3.4") is None                     # ANY: SUB is enough
    assert A.check_grpc(table, "ReceiveMessage", spb.ReceiveMessageRequest(
        group=R("G1"), message_queue=pb.MessageQueue(topic=R("audit"))), "pubOnly1", good("pubSecret1"),
        "1.2.3.4") is None
    # an admin account without per-resource permissions may do anything
    assert A.check_grpc(table, "SendMessage", send("anything"), "admin001", good("adminSecret"), "1.2.3.4") is None


def test_denials_in_javas_order(table):
    d = A.check_grpc(table, "SendMessage", send("orders"), None, good("x"), "1.2.3.4")
    assert (d.reason, d.message) == ("no_access_key", "No accessKey is configured")
    d = A.check_grpc(table, "SendMessage", send("orders"), "nobody00", good("x"), "1.2.3.4")
    assert (d.reason, d.message) == ("unknown_key", "No acl config for nobody00")
    d = A.check_grpc(table, "SendMessage", send("orders"), "pubOnly1", good("wrong"), "1.2.3.4")
    assert (d.reason, d.message) == ("signature", "Check signature failed for accessKey=pubOnly1")
    d = A.check_grpc(table, "SendMessage", send("audit"), "pubOnly1", good("pubSecret1"), "1.2.3.4")
    assert (d.reason, d.message, d.resource) == ("perm", "No default permission for topic:audit", "topic:audit")
    d = A.check_grpc(table, "SendMessage", send("other"), "pubOnly1", good("pubSecret1"), "1.2.3.4")
    assert d.reason == "default_perm"
    d = A.check_grpc(table, "AckMessage", spb.AckMessageRequest(group=R("G2"), topic=R("audit")), "pubOnly1",
                     good("pubSecret1"), "1.2.3.4")
    assert d.resource == "group:G2"
    d = A.check_grpc(table, "Heartbeat", spb.HeartbeatRequest(client_type=pb.PUSH_CONSUMER), "pubOnly1",
                     good("pubSecret1"), "1.2.3.4")
    assert (d.reason, d.message) == ("parse", "Consumer heartbeat doesn't have group")


def test_white_addresses_and_header_errors(table):
    never = good(object())
    # a global white address: no key, no signature, no header needed
    assert A.check_grpc(table, "SendMessage", send("x"), None, never, "10.9.9.4") is None
    assert A.check_grpc(table, "SendMessage", send("x"), None, never, "10.9.9.4", header_error="missing") is None
    d = A.check_grpc(table, "SendMessage", send("x"), None, never, "10.9.8.4", header_error="it is missing")
    assert (d.reason, d.message) == ("header", "it is missing")
    # the account's white address skips the signature and the permissions (Java's order)
    assert A.check_grpc(table, "SendMessage", send("x"), "whiteAcct", never, "192.168.7.20") is None
    assert A.check_grpc(table, "SendMessage", send("x"), "whiteAcct", never, "192.168.8.20").reason == "signature"


# --- the guard: statuses, the deny log and metrics --------------------------------------------------

class Ctx:
    def __init__(self, metadata, peer="ipv4:1.2.3.4:5555"):
        self.metadata = metadata
        self._peer = peer

    def invocation_metadata(self):
        return self.metadata

    def peer(self):
        return self._peer


def signed(ak, secret, date="20240101T000000Z"):
    return [("x-mq-date-time", date),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
                              f"Signature={auth.sign(secret, date)}")]


@pytest.fixture
def guard(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_bytes(ACL_YML)
    svc = AclService(str(path))
    svc.load()
    return auth.GrpcAclGuard(svc)


def test_guard_answers_and_counts(guard):
    assert guard.deny("SendMessage", send("orders"), Ctx(signed("pubOnly1", "pubSecret1"))) is None
    cases = [
        (Ctx(signed("pubOnly1", "wrongSecret")), pb.Code.UNAUTHORIZED, "Check signature failed"),
        (Ctx(signed("unknown01", "pubSecret1")), pb.Code.UNAUTHORIZED, "No acl config for unknown01"),
        (Ctx([]), pb.Code.UNAUTHORIZED, "authorization header is missing"),
        (Ctx(signed("pubOnly1", "pubSecret1")[1:]), pb.Code.UNAUTHORIZED, "x-mq-date-time header"),
        (Ctx([("x-mq-date-time", "d"), ("authorization", "garbage")]), pb.Code.UNAUTHORIZED, "incorrect"),
    ]
    for ctx, code, words in cases:
        st = guard.deny("SendMessage", send("orders"), ctx)
        assert st.code == code and words in st.message, (st, words)
    st = guard.deny("SendMessage", send("audit"), Ctx(signed("pubOnly1", "pubSecret1")))
    assert st.code == pb.Code.FORBIDDEN and st.message == "ACL: No default permission for topic:audit"
    # a global white peer needs nothing
    assert guard.deny("SendMessage", send("x"), Ctx([], peer="ipv4:10.9.9.1:4000")) is None
    assert guard.deny("SendMessage", send("x"), Ctx([], peer="ipv6:[::ffff:10.9.9.1]:4000")) is None
    denied = guard.acl.denied
    assert denied[("signature", "SendMessage")] == 1 and denied[("perm", "SendMessage")] == 1
    assert denied[("header", "SendMessage")] == 3 and denied[("unknown_key", "SendMessage")] == 1


def test_deny_metrics_take_rpc_names_beside_request_codes(guard):
    guard.acl.denied[("signature", 10)] = 2
    guard.deny("QueryRoute", spb.QueryRouteRequest(topic=R("T")), Ctx(signed("pubOnly1", "bad_secret")))
    fams = {f.name: f for f in acl_metrics(guard.acl, ["broker"], ["b"])}
    samples = {(s.labels["reason"], s.labels["code"]): s.value for s in fams["pocketmq_acl_denied"].samples
               if s.name.endswith("_total")}
    assert samples == {("signature", "10"): 2, ("signature", "QueryRoute"): 1}


def test_deny_log_is_rate_limited(guard, caplog):
    caplog.set_level("WARNING", logger="pocketmq.acl")
    for _ in range(5):
        guard.deny("SendMessage", send("orders"), Ctx(signed("pubOnly1", "wrongSecret")))
    lines = [r for r in caplog.records if "ACL denied" in r.getMessage()]
    assert len(lines) == 1 and "SendMessage" in lines[0].getMessage() and "1.2.3.4" in lines[0].getMessage()
    assert guard.acl.denied[("signature", "SendMessage")] == 5


def test_hot_reloaded_table_is_the_one_checked(guard, tmp_path):
    ctx = Ctx(signed("pubOnly1", "pubSecret1"))
    assert guard.deny("SendMessage", send("audit"), ctx).code == pb.Code.FORBIDDEN
    (tmp_path / "plain_acl.yml").write_bytes(ACL_YML.replace(b"audit=SUB", b"audit=PUB|SUB") + b"\n")
    assert guard.acl.poll()
    assert guard.deny("SendMessage", send("audit"), ctx) is None
