"""The client's ACL half: credentials, signing in the one place requests leave
(ClientConnection.send), the producer's pre-built SEND fields signed like the plain path's,
and an ACL deny raised as AclDeniedError naming the account and the reason."""
import pytest

from pocketmq.client.api import ClientAPI
from pocketmq.client.connection import ClientConnection, ClientRemoting
from pocketmq.client.consumer_config import LitePullConsumerConfig, PushConsumerConfig
from pocketmq.client.credentials import (
    Credentials,
    as_credentials,
    credentials_from_env,
    resolve_credentials,
)
from pocketmq.client.errors import AclDeniedError, BrokerSystemError, InvalidArgumentError, error_for
from pocketmq.client.producer import Producer, send_ext_fields
from pocketmq.protocol.acl import ACCESS_KEY, ONS_CHANNEL, SIGNATURE, sign_request, signature_matches
from pocketmq.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header

AK, SK = "RocketMQ", "12345678"
JAVA_DENY = ("org.apache.rocketmq.acl.common.AclException: No default permission for TopicA, "
             "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:394)")


class _Transport:
    def __init__(self):
        self.writes = []

    def writelines(self, parts):
        self.writes.append(b"".join(bytes(p) for p in parts))

    def is_closing(self):
        return False

    def close(self):
        pass

    def get_extra_info(self, name, default=None):
        return default

    def frames(self):
        dec = FrameDecoder()
        for w in self.writes:
            dec.feed(w)
        return list(dec.commands())


def _signing_conn(creds):
    conn = ClientConnection(signer=creds)
    t = _Transport()
    conn.connection_made(t)
    return conn, t


# --- credentials -----------------------------------------------------------------------------

def test_credentials_forms_and_secret_not_in_repr():
    assert as_credentials(None) is None
    c = as_credentials((AK, SK))
    assert c == Credentials(AK, SK) and SK not in repr(c)
    assert as_credentials((AK, SK, "LOCAL")).channel == "LOCAL"      # the C++ wheel's order
    t = as_credentials((AK, SK, "LOCAL", "tok"))
    assert t.security_token == "tok" and "tok" not in repr(t)
    for bad in ((AK,), (AK, ""), ("", SK), "ak:sk", (AK, SK, 5), (AK, "secret\ud800")):
        with pytest.raises(InvalidArgumentError):
            as_credentials(bad)


def test_credentials_sign_as_sign_request_and_pickle_without_their_signer():
    # Credentials keep a signer made once (protocol/acl.py request_signer, a closure): it must
    # sign exactly as sign_request, and the Spark source pickles its options to executors
    import pickle
    for creds in (Credentials(AK, SK), Credentials(AK, SK, "LOCAL", "tok")):
        back = pickle.loads(pickle.dumps(creds))
        assert back == creds and hash(back) == hash(creds)
        for c in (creds, back):
            cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={"b": "T", "Signature": "old"}, body=b"x")
            c.sign(cmd)
            assert cmd.ext_fields == sign_request({"b": "T"}, b"x", AK, SK, creds.security_token, creds.channel)
            assert signature_matches(cmd.ext_fields, b"x", SK)


def test_credentials_from_env_and_flags():
    assert credentials_from_env({}) is None
    env = {"ROCKETMQ_ACCESS_KEY": AK, "ROCKETMQ_SECRET_KEY": SK}
    assert credentials_from_env(env) == Credentials(AK, SK)
    with pytest.raises(InvalidArgumentError, match="ROCKETMQ_SECRET_KEY"):
        credentials_from_env({"ROCKETMQ_ACCESS_KEY": AK})
    # flags win over the environment; one flag alone is an error naming the other
    assert resolve_credentials("otherKey", "otherSecret", env) == Credentials("otherKey", "otherSecret")
    assert resolve_credentials(None, None, env) == Credentials(AK, SK)
    with pytest.raises(InvalidArgumentError, match="secretKey"):
        resolve_credentials(AK, None, env)


def test_client_options_take_credentials():
    cfg = PushConsumerConfig(credentials=(AK, SK))
    assert cfg.credentials == Credentials(AK, SK)
    assert LitePullConsumerConfig(credentials=Credentials(AK, SK, "LOCAL")).credentials.channel == "LOCAL"
    assert Producer("PG", "127.0.0.1:9876", credentials=(AK, SK)).credentials == Credentials(AK, SK)
    with pytest.raises(InvalidArgumentError):
        PushConsumerConfig(credentials=("short",))
    with pytest.raises(TypeError, match="tls"):
        Producer("PG", "127.0.0.1:9876", tls="yes")


# --- signing where requests leave -----------------------------------------------------------

@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.MSGPACK])
def test_every_request_is_signed_once_responses_never(st):
    creds = Credentials(AK, SK, "LOCAL")
    conn, t = _signing_conn(creds)
    req = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "T"}, serialize_type=st)
    conn.send(req)
    conn.send(req)                       # a retry of the same command: signed afresh, not twice
    oneway = RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={"a": "1"}, serialize_type=st)
    conn.oneway(oneway)
    body_req = RemotingCommand(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}', serialize_type=st)
    conn.send(body_req)
    resp = RemotingCommand(ResponseCode.SUCCESS, flag=FLAG_RESPONSE, ext_fields={"k": "v"}, serialize_type=st)
    conn.send(resp)
    frames = t.frames()
    for f in frames[:4]:
        assert f.ext_fields[ACCESS_KEY] == AK and f.ext_fields[ONS_CHANNEL] == "LOCAL"
        assert signature_matches(f.ext_fields, f.body, SK)
        assert not signature_matches(f.ext_fields, f.body, "wrong-secret")
    assert frames[0].ext_fields == frames[1].ext_fields
    assert frames[4].ext_fields == {"k": "v"}      # the response went out unsigned


def test_unsigned_without_credentials():
    conn = ClientConnection()
    t = _Transport()
    conn.connection_made(t)
    conn.send(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "T"}))
    assert t.frames()[0].ext_fields == {"topic": "T"}


def test_remoting_dials_signing_connections():
    creds = Credentials(AK, SK)
    r = ClientRemoting(credentials=creds)
    conn = r.connection_class(None, name="x")
    assert isinstance(conn, ClientConnection) and conn.signer is creds
    assert ClientRemoting().connection_class(None).signer is None


@pytest.mark.parametrize("batch", [False, True])
def test_send_fast_path_signed_as_the_plain_path(batch):
    """The producer's pre-built SEND_MESSAGE_V2 fields (send_ext_fields) sign to exactly what
    the typed header's fields sign to, and the frame the connection writes verifies."""
    props = "WAIT\x01true\x02UNIQ_KEY\x01AC1100"
    h = SendMessageRequestHeader("PG", "T", "TBW102", 4, 3, 0, 1_700_000_000_123, 0, props, 0, False, batch, None)
    body = b"payload \x00\xff"
    plain = sign_request(encode_send_header(h, v2=True), body, AK, SK)
    fast = sign_request(send_ext_fields("PG", "T", 3, 0, 0, props, batch, 1_700_000_000_123), body, AK, SK)
    assert fast == plain
    conn, t = _signing_conn(Credentials(AK, SK))
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    conn.send(RemotingCommand(code, 0, 0, None, send_ext_fields("PG", "T", 3, 0, 0, props, batch,
                                                                 1_700_000_000_123), body,
                              serialize_type=SerializeType.MSGPACK))
    f = t.frames()[0]
    assert f.ext_fields[SIGNATURE] == plain[SIGNATURE] and signature_matches(f.ext_fields, f.body, SK)


# --- an ACL deny ---------------------------------------------------------------------------------

def test_acl_deny_is_its_own_error_naming_account_and_reason():
    e = error_for(ResponseCode.SYSTEM_ERROR, JAVA_DENY, "127.0.0.1:10911", AK)
    assert isinstance(e, AclDeniedError) and isinstance(e, PermissionError)
    assert not e.retriable
    assert e.account == AK and e.reason == "No default permission for TopicA"
    assert str(e) == "ACL denied account RocketMQ by 127.0.0.1:10911: No default permission for TopicA"
    anon = error_for(ResponseCode.SYSTEM_ERROR, "org.apache.rocketmq.acl.common.AclException: "
                     "No accessKey is configured, org.apache.rocketmq.acl.plain.PlainPermissionManager"
                     ".validate(PlainPermissionManager.java:394)", "ns:9876")
    assert "without credentials" in str(anon) and anon.reason == "No accessKey is configured"
    # a reason with commas keeps them; only the trailing stack frame goes
    e2 = error_for(1, "AclException: No acl config for a, b, X.y(Z.java:1)")
    assert e2.reason == "No acl config for a, b"
    # other system errors are unchanged
    assert type(error_for(ResponseCode.SYSTEM_ERROR, "store full")) is BrokerSystemError


async def test_client_api_names_the_signing_account():
    class _T:
        credentials = Credentials(AK, SK)

        async def invoke(self, addr, cmd, timeout_s):
            return RemotingCommand(ResponseCode.SYSTEM_ERROR, flag=FLAG_RESPONSE, remark=JAVA_DENY)

    with pytest.raises(AclDeniedError, match="account RocketMQ by b:1: No default permission for TopicA"):
        await ClientAPI(_T())._ok("b:1", RequestCode.GET_MAX_OFFSET, {"topic": "TopicA", "queueId": "0"})


# --- the Spark source's and sink's options ---------------------------------------------------------

def test_spark_options_take_credentials():
    from pocketmq.spark.options import OptionError, parse_reader_options, parse_writer_options
    base = {"namesrvAddr": "h:1", "subscribe": "T"}
    r = parse_reader_options({**base, "accesskey": AK, "SECRETKEY": SK})     # case-insensitive, as Spark's
    assert r.credentials == Credentials(AK, SK) and SK not in repr(r)
    assert parse_reader_options(base).credentials is None
    env = {"ROCKETMQ_ACCESS_KEY": AK, "ROCKETMQ_SECRET_KEY": SK}
    assert parse_writer_options({"namesrvAddr": "h:1"}, environ=env).credentials == Credentials(AK, SK)
    assert parse_reader_options(base, streaming=True, environ=env).credentials == Credentials(AK, SK)
    with pytest.raises(OptionError, match="secretKey is missing"):
        parse_writer_options({"namesrvAddr": "h:1", "accessKey": AK})
