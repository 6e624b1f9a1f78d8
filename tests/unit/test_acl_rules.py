"""The plain ACL's rules (common/acl.py): permissions, address patterns, plain_acl.yml, the
resources of each request code, Java 4.9's decision order and message texts, the admin
codes' file edits. Java's texts and line numbers are PlainPermissionManager.java's at
rocketmq-all-4.9.8."""
from __future__ import annotations

import json
import struct

import pytest

from pocketmq.common import acl as A
from pocketmq.protocol.acl import sign, sign_request
from pocketmq.protocol.codes import RequestCode as R
from pocketmq.protocol.command import FrameDecoder

PPM = "org.apache.rocketmq.acl.plain.PlainPermissionManager"

SAMPLE = b"""\
globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
    groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]
  - accessKey: rocketmq2
    secretKey: "12345678"
    whiteRemoteAddress: 192.168.1.*
    admin: true
  - accessKey: adminWithPerms
    secretKey: adminSecret
    admin: true
    defaultTopicPerm: SUB
    topicPerms:
      - secretT=DENY
"""

AK, SK = "RocketMQ", "12345678"


@pytest.fixture(scope="module")
def table():
    return A.build_table([A.parse_acl_file(SAMPLE, "/conf/plain_acl.yml")])


def signed(ext, body=None, ak=AK, sk=SK):
    return sign_request(ext, body, ak, sk)


# --- permissions ------------------------------------------------------------------------------

@pytest.mark.parametrize("text,perm", [("PUB", A.PUB), ("SUB", A.SUB), ("PUB|SUB", A.PUB | A.SUB),
                                       ("SUB|PUB", A.PUB | A.SUB), ("DENY", A.DENY), (" SUB ", A.SUB),
                                       ("sub", A.DENY), ("PUB | SUB", A.DENY), ("ANY", A.DENY), ("", A.DENY),
                                       (None, A.DENY), (5, A.DENY)])
def test_parse_perm_missing_or_unknown_is_deny(text, perm):
    assert A.parse_perm(text) == perm


# --- address patterns -------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,yes,no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("*.*.*.*", ["1.2.3.4"], []),
    ("", [], ["1.2.3.4", "127.0.0.1"]),
    ("192.168.0.*", ["192.168.0.1", "192.168.0.255"], ["192.168.1.1", "10.0.0.1", "::1"]),
    ("192.168.*", ["192.168.9.9"], ["192.169.0.1"]),
    ("192.168.*.*", ["192.168.9.9"], ["192.169.0.1"]),
    ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.1.0"]),
    ("192.168.1-3.*", ["192.168.2.77"], ["192.168.4.1"]),
    ("192.168.1.{1,2}", ["192.168.1.1", "192.168.1.2"], ["192.168.1.3"]),
    ("1.1.1.1,2.2.2.2", ["1.1.1.1", "2.2.2.2"], ["3.3.3.3"]),
    ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["::2", "127.0.0.1"]),
    ("1050:0000:0000:0000:0005:0600:300c:*", ["1050::5:600:300c:1", "1050::5:600:300c:ffff"],
     ["1050::5:600:300d:1"]),
    ("1050::0005:0600:300c:1-ff", ["1050::5:600:300c:ff"], ["1050::5:600:300c:100"]),
    ("2::ac5:78:1-200:*", ["2::ac5:78:150:3"], ["2::ac5:78:201:3"]),
    ("1050::0005:0600:300c:{1,2}", ["1050::5:600:300c:2"], ["1050::5:600:300c:3"]),
])
def test_address_patterns(pattern, yes, no):
    p = A.parse_address_pattern(pattern)
    assert all(p.match(ip) for ip in yes), [ip for ip in yes if not p.match(ip)]
    assert not any(p.match(ip) for ip in no), [ip for ip in no if p.match(ip)]
    assert not p.match(None) or p.kind == "all"


@pytest.mark.parametrize("pattern,fragment", [
    ("300.1.1.1", "Netaddress examine Exception netaddress is 300.1.1.1"),
    ("hello", "Netaddress examine Exception"),
    ("1.1.1.1,banana", "netaddress is banana"),
    ("192.168.1.100-1", "examine scope Exception start is 100 , end is 1"),
    ("*.168.1.1", "Netaddress examine scope Exception"),
    ("10.*.1.2", "Netaddress examine scope Exception"),    # Java would let all of 10/8 in
    ("192.168.1.-5", "Netaddress examine scope Exception"),
    ("192.168.1.{1,x}", "Netaddress examine Exception"),
])
def test_bad_address_patterns_are_refused(pattern, fragment):
    with pytest.raises(ValueError, match=fragment.replace("*", r"\*").replace(".", r"\.")):
        A.parse_address_pattern(pattern)


# --- the file ---------------------------------------------------------------------------------

def test_sample_file_model(table):
    a = table.accounts[AK]
    assert a.secret_key == "12345678"            # YAML's integer read as Java's String
    assert not a.admin and a.default_topic_perm == A.DENY and a.default_group_perm == A.SUB
    assert a.perms == {"%RETRY%groupA": A.DENY, "%RETRY%groupB": A.PUB | A.SUB, "%RETRY%groupC": A.SUB,
                       "topicA": A.DENY, "topicB": A.PUB | A.SUB, "topicC": A.SUB}
    assert (a.path, a.line) == ("/conf/plain_acl.yml", 3)
    r2 = table.accounts["rocketmq2"]
    assert r2.admin and r2.perms is None and r2.default_topic_perm == A.DENY
    assert [p.text for p in table.global_white] == ["10.10.103.*", "192.168.0.*"]


@pytest.mark.parametrize("ak,sk", [("short", "12345678"), ("RocketMQ", "123456"), ("RocketMQ", None), (None, "x" * 9)])
def test_keys_of_six_characters_or_fewer_are_refused_naming_file_and_line(ak, sk):
    lines = ["accounts:", "  - accessKey: longenough", "    secretKey: longenough", "  - admin: false"]
    if ak is not None:
        lines.append(f"    accessKey: {ak}")
    if sk is not None:
        lines.append(f"    secretKey: {sk}")
    with pytest.raises(A.AclConfigError) as e:
        A.parse_acl_file("\n".join(lines), "/etc/acl/x.yml")
    msg = str(e.value)
    assert msg.startswith("/etc/acl/x.yml:4: The accessKey=")
    assert "cannot be null and length should longer than 6" in msg
    assert sk is None or sk not in msg.split("accessKey=")[1].split(" and")[1]   # the secret is not logged


@pytest.mark.parametrize("text,fragment", [
    ("accounts: [unclosed", "x.yml:1"),
    ("accounts:\n  - accessKey: abcdefgh\n    secretKey: abcdefgh\n    topicPerms: [a=PUB=SUB]\n",
     "x.yml:2: Parse resource permission failed for topic:a=PUB=SUB"),
    ("accounts:\n  - accessKey: abcdefgh\n    secretKey: abcdefgh\n    whiteRemoteAddress: 999.1.1.1\n",
     "x.yml:2: Netaddress examine Exception"),
    ("- just\n- a list\n", "x.yml:1: expected a map"),
    ("accounts: 5\n", "accounts must be a list"),
    ("accounts:\n  - 5\n", "x.yml:2: an account must be a map"),
    ("globalWhiteRemoteAddresses: [[1]]\n", "globalWhiteRemoteAddresses: expected a single value"),
    ("accounts:\n  - accessKey: abcdefgh\n    secretKey: abcdefgh\n    admin: maybe\n", "expected true or false"),
    ("a: !!python/object/apply:os.system ['true']\n", "x.yml:1"),
    ("[" * 5000 + "]" * 5000, "x.yml"),
])
def test_bad_files_are_refused_with_a_reason(text, fragment):
    with pytest.raises(A.AclConfigError, match=fragment.replace("[", r"\[").replace("*", r"\*")):
        A.parse_acl_file(text, "x.yml")


def test_hostile_yaml_aliases_do_not_explode():
    # a billion-laughs document: aliases are shared, and the shape check refuses nested lists
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")) + "globalWhiteRemoteAddresses: *i\n"
    with pytest.raises(A.AclConfigError):
        A.parse_acl_file(bomb, "x.yml")
    with pytest.raises(A.AclConfigError, match="larger than"):
        A.parse_acl_file(b"#" * (A.MAX_FILE_BYTES + 1), "x.yml")
    with pytest.raises(A.AclConfigError, match="not UTF-8"):
        A.parse_acl_file(b"accounts: \xff\n", "x.yml")


def test_empty_file_and_duplicates_across_files():
    for empty in (b"", b"# only a comment\n", b"{}\n", b"~\n"):
        f = A.parse_acl_file(empty, "e.yml")
        assert (f.accounts, f.has_data) == ((), False), empty
    assert A.parse_acl_file(b"accounts: []\n", "e.yml").has_data
    first = A.parse_acl_file("accounts:\n  - {accessKey: dupKey01, secretKey: firstSecret}\n", "acl/a.yml")
    second = A.parse_acl_file("globalWhiteRemoteAddresses: ['1.2.3.4']\naccounts:\n"
                              "  - {accessKey: dupKey01, secretKey: secondSecret}\n", "plain_acl.yml")
    t = A.build_table([first, second])
    assert t.accounts["dupKey01"].secret_key == "firstSecret"
    assert t.duplicates == (("dupKey01", "plain_acl.yml"),)
    assert [p.text for p in t.global_white] == ["1.2.3.4"]


# --- the resources of each request code (PlainAccessValidator.parse + the stricter list) -------

def heartbeat(groups: dict) -> bytes:
    return json.dumps({"clientID": "c1", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": [
        {"groupName": g, "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}
        for g, topics in groups.items()]}).encode()


@pytest.mark.parametrize("code,ext,body,want", [
    (R.SEND_MESSAGE, {"topic": "T", "producerGroup": "PG"}, None, {"T": A.PUB}),
    (R.SEND_MESSAGE, {"topic": "%RETRY%G", "group": "G"}, None, {"%RETRY%G": A.SUB}),
    (R.SEND_MESSAGE_V2, {"b": "T", "a": "PG"}, None, {"T": A.PUB}),
    (R.SEND_MESSAGE_V2, {"b": "%RETRY%G", "a": "G"}, None, {"%RETRY%G": A.SUB}),
    (R.SEND_BATCH_MESSAGE, {"b": "T", "a": "PG"}, None, {"T": A.PUB}),       # stricter than 4.9.8
    (R.SEND_BATCH_MESSAGE, {"topic": "T"}, None, {"T": A.PUB}),
    (R.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"}, None, {"T": A.SUB, "%RETRY%G": A.SUB}),
    (R.CONSUMER_SEND_MSG_BACK, {"group": "G", "offset": "1"}, None, {"%RETRY%G": A.SUB}),
    (R.QUERY_MESSAGE, {"topic": "T", "key": "k"}, None, {"T": A.SUB}),
    (R.HEART_BEAT, {}, heartbeat({"G1": ["T1", "T2"], "G2": ["T3"]}), {
        "%RETRY%G1": A.SUB, "T1": A.SUB, "T2": A.SUB, "%RETRY%G2": A.SUB, "T3": A.SUB}),
    (R.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "G"}, None, {"%RETRY%G": A.SUB}),
    (R.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "P"}, None, {}),
    (R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}, None, {"%RETRY%G": A.SUB}),
    (R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T", "queueId": "0", "commitOffset": "5"}, None,
     {"%RETRY%G": A.SUB, "T": A.SUB}),
    (R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T"}, None, {}),   # signature only, as Java
    (R.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, None, {}),
])
def test_resources_of_each_request_code(code, ext, body, want):
    assert A.request_resources(int(code), ext, body) == want


def test_admin_codes():
    java = {17, 25, 215, 200, 207}
    ours = {50, 51, 52, 53, 54, 222, 314, 306, 26}
    assert A.BROKER_ADMIN_CODES == java | ours
    assert A.NAMESRV_PROTECTED_CODES == {103, 104, 100, 102, 318, 216, 205, 327}


# --- the decision: Java's order and texts -------------------------------------------------------

def remark(d: A.Denial) -> str:
    return d.remark


def test_global_white_address_allows_before_any_key(table):
    assert A.check(table, R.SEND_MESSAGE_V2, {"b": "topicA"}, None, "192.168.0.7") is None
    assert A.check(table, R.UPDATE_AND_CREATE_TOPIC, None, None, "10.10.103.1") is None


def test_no_access_key(table):
    d = A.check(table, R.SEND_MESSAGE_V2, {"b": "topicB"}, b"x", "1.1.1.1")
    assert remark(d) == ("org.apache.rocketmq.acl.common.AclException: No accessKey is configured, "
                         f"{PPM}.validate(PlainPermissionManager.java:664)")
    assert A.check(table, R.HEART_BEAT, None, None, "1.1.1.1").reason == "no_access_key"


def test_unknown_key(table):
    d = A.check(table, R.SEND_MESSAGE_V2, signed({"b": "topicB"}, ak="nobody99"), None, "1.1.1.1")
    assert remark(d).endswith(f"No acl config for nobody99, {PPM}.validate(PlainPermissionManager.java:668)")
    assert d.access_key == "nobody99"


def test_account_white_address_skips_signature_and_permissions(table):
    ext = {"b": "anything", "AccessKey": "rocketmq2", "Signature": "garbage"}
    assert A.check(table, R.SEND_MESSAGE_V2, ext, None, "192.168.1.9") is None
    d = A.check(table, R.SEND_MESSAGE_V2, ext, None, "192.168.2.9")
    assert remark(d).endswith(f"Check signature failed for accessKey=rocketmq2, "
                              f"{PPM}.validate(PlainPermissionManager.java:684)")


@pytest.mark.parametrize("mutate", ["secret", "field", "body", "missing", "not base64"])
def test_bad_signature(table, mutate):
    ext = signed({"b": "topicB", "a": "PG"}, b"body")
    body = b"body"
    if mutate == "secret":
        ext = signed({"b": "topicB", "a": "PG"}, b"body", sk="87654321")
    elif mutate == "field":
        ext["a"] = "PG2"
    elif mutate == "body":
        body = b"bodY"
    elif mutate == "missing":
        del ext["Signature"]
    else:
        ext["Signature"] = "\u00e9\u00e9"
    d = A.check(table, R.SEND_MESSAGE_V2, ext, body, "1.1.1.1")
    assert d.reason == "signature" and d.message == f"Check signature failed for accessKey={AK}"


def test_pub_on_the_trace_topic_is_allowed(table):
    assert A.check(table, R.SEND_MESSAGE_V2, signed({"b": "RMQ_SYS_TRACE_TOPIC"}), None, "1.1.1.1") is None
    d = A.check(table, R.PULL_MESSAGE, signed({"topic": "RMQ_SYS_TRACE_TOPIC", "consumerGroup": "groupC"}),
                None, "1.1.1.1")
    assert d.message == "No default permission for topic:RMQ_SYS_TRACE_TOPIC"


def test_admin_codes_need_admin(table):
    for code in sorted(A.BROKER_ADMIN_CODES):
        d = A.check(table, code, signed({"x": "1"}), None, "1.1.1.1")
        assert remark(d).endswith(f"Need admin permission for request code={code}, but accessKey={AK} is not, "
                                  f"{PPM}.checkPerm(PlainPermissionManager.java:581)")
        assert A.check(table, code, signed({"x": "1"}, ak="rocketmq2"), None, "1.1.1.1") is None


def test_admin_without_resource_perms_may_do_anything_with_perms_is_checked(table):
    assert A.check(table, R.SEND_MESSAGE_V2, signed({"b": "any"}, ak="rocketmq2"), None, "1.1.1.1") is None
    adm = dict(ak="adminWithPerms", sk="adminSecret")
    assert A.check(table, R.UPDATE_AND_CREATE_TOPIC, signed({"topic": "x"}, **adm), None, "1.1.1.1") is None
    d = A.check(table, R.PULL_MESSAGE, signed({"topic": "secretT", "consumerGroup": "g"}, **adm), None, "1.1.1.1")
    assert d.message == "No default permission for topic:secretT" and d.reason == "perm"
    d = A.check(table, R.SEND_MESSAGE_V2, signed({"b": "otherT"}, **adm), None, "1.1.1.1")
    assert d.message == "No default permission for topic:otherT" and d.reason == "default_perm"


@pytest.mark.parametrize("code,ext,body,want", [
    (R.SEND_MESSAGE_V2, {"b": "topicB"}, b"m", None),
    (R.SEND_MESSAGE_V2, {"b": "topicC"}, b"m", ("perm", "topic:topicC")),
    (R.SEND_MESSAGE_V2, {"b": "topicZ"}, b"m", ("default_perm", "topic:topicZ")),
    (R.SEND_MESSAGE_V2, {"b": "%RETRY%groupB", "a": "groupB"}, b"m", None),
    (R.SEND_MESSAGE_V2, {"b": "%RETRY%groupA", "a": "groupA"}, b"m", ("perm", "group:groupA")),
    (R.SEND_BATCH_MESSAGE, {"b": "topicA"}, b"m", ("perm", "topic:topicA")),
    (R.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupZ"}, None, None),
    (R.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupA"}, None, ("perm", "group:groupA")),
    (R.QUERY_MESSAGE, {"topic": "topicZ"}, None, ("default_perm", "topic:topicZ")),
    (R.HEART_BEAT, {}, heartbeat({"groupC": ["topicB", "topicZ"]}), ("default_perm", "topic:topicZ")),
    (R.CONSUMER_SEND_MSG_BACK, {"group": "groupA"}, None, ("perm", "group:groupA")),
    (R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "groupC", "topic": "topicA"}, None, ("perm", "topic:topicA")),
    (R.UNREGISTER_CLIENT, {"consumerGroup": "groupA", "clientID": "c"}, None, ("perm", "group:groupA")),
    (R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "groupB"}, None, None),
    (R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "groupA", "topic": "topicA"}, None, None),
])
def test_permissions_per_request_code(table, code, ext, body, want):
    d = A.check(table, int(code), signed(ext, body), body, "1.1.1.1")
    if want is None:
        assert d is None, d
    else:
        reason, name = want
        line = 611 if reason == "perm" else 606
        assert (d.reason, d.resource) == want
        assert d.remark == (f"org.apache.rocketmq.acl.common.AclException: No default permission for {name}, "
                            f"{PPM}.checkPerm(PlainPermissionManager.java:{line})")


def test_undecodable_heartbeat_is_a_parse_deny_even_from_a_white_address(table):
    d = A.check(table, R.HEART_BEAT, {"x": "1"}, b"{not json", "192.168.0.1")
    assert d.reason == "parse"
    assert d.remark.endswith("org.apache.rocketmq.acl.plain.PlainAccessValidator.parse(PlainAccessValidator.java:134)")


def test_java_string_hash_and_hashmap_order():
    assert A._java_string_hash("hello") == 99162322
    assert A._java_string_hash("") == 0
    assert A._java_string_hash("\U0001F600") == (0xD83D * 31 + 0xDE00)    # UTF-16 code units
    # HashMap(16) buckets: "b" (98 -> 2) before "a" inserted after it? no: "a" (97 -> 1) first
    assert A.java_hash_order(["b", "a"]) == ["a", "b"]
    # both failing: Java names the one its HashMap iterates first, not the first inserted
    t = A.build_table([A.parse_acl_file(b"accounts:\n  - {accessKey: abcdefgh, secretKey: abcdefgh}\n", "x")])
    order = A.java_hash_order(["TopicZ", "%RETRY%GroupZ"])
    d = A.check(t, R.PULL_MESSAGE, signed({"topic": "TopicZ", "consumerGroup": "GroupZ"}, ak="abcdefgh",
                                          sk="abcdefgh"), None, "1.1.1.1")
    assert d.resource == ("topic:TopicZ" if order[0] == "TopicZ" else "group:GroupZ")


def test_json_booleans_and_numbers_reach_the_check_as_ali_ons_signed_them(table):
    # a JSON header as ali-ons sends SEND_MESSAGE_V2: "k": false, "e": 1 (not strings)
    ext = {"a": "PG", "b": "topicB", "e": 1, "k": False, "AccessKey": AK, "OnsChannel": "ALIYUN"}
    js_text = {"a": "PG", "b": "topicB", "e": "1", "k": "false", "AccessKey": AK, "OnsChannel": "ALIYUN"}
    content = "".join(js_text[k] for k in sorted(js_text)).encode() + b"body"
    ext["Signature"] = sign(content, SK)
    header = json.dumps({"code": 310, "language": "JAVA", "version": 317, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    frame = struct.pack(">ii", 4 + len(header) + 4, len(header)) + header + b"body"
    dec = FrameDecoder()
    dec.feed(frame)
    cmd = dec.next_command()
    assert cmd.ext_fields["k"] == "false" and cmd.ext_fields["e"] == "1"
    assert A.check(table, cmd.code, cmd.ext_fields, cmd.body, "1.1.1.1") is None
    # Python's text of the same values would not match
    py = dict(js_text, k="False")
    bad = dict(cmd.ext_fields, Signature=sign("".join(py[k] for k in sorted(py)).encode() + b"body", SK))
    assert A.check(table, cmd.code, bad, cmd.body, "1.1.1.1").reason == "signature"


def test_check_never_raises_on_hostile_requests(table):
    import random
    rng = random.Random(32)
    for _ in range(2000):
        ext = {rng.choice(["AccessKey", "Signature", "b", "a", "topic", "consumerGroup", "x"]):
               rng.choice(["", AK, "%RETRY%", "\u0000", "topicB", "x" * 1000, "x\ud800"])
               for _ in range(rng.randrange(6))}
        body = rng.choice([None, b"", b"{}", b"\xff" * 10, b'{"clientID":"c","consumerDataSet":[{"x":1}]}'])
        code = rng.choice([10, 11, 12, 15, 17, 34, 35, 36, 38, 50, 310, 320, 999])
        d = A.check(table, code, ext, body, rng.choice(["1.1.1.1", "", None, "not-an-ip", "::1"]))
        assert d is None or d.remark.startswith("org.apache.rocketmq.acl.common.AclException: ")


NO_GLOBAL_WHITE = SAMPLE.split(b"\n", 1)[1] + b"""\
  - accessKey: pubOnlyUser
    secretKey: pubOnlySecret
    defaultTopicPerm: PUB
    defaultGroupPerm: DENY
  - accessKey: freeAdmin
    secretKey: freeAdminSecret
    admin: true
"""


@pytest.mark.parametrize("text", [SAMPLE, NO_GLOBAL_WHITE], ids=["global-white", "no-global-white"])
def test_checker_answers_as_check_on_random_requests(text):
    # common/acl.py `checker` keeps the hot codes' decisions per (accessKey, code, names);
    # every answer must be the plain rule's, repeated requests (kept decisions) included:
    # a kept decision never lets a bad signature, another account or another name through
    import random
    t = A.build_table([A.parse_acl_file(text, "/conf/plain_acl.yml")])
    fast = A.checker(t)
    rng = random.Random(35)
    accounts = [(AK, SK), ("rocketmq2", "12345678"), ("adminWithPerms", "adminSecret"),
                ("pubOnlyUser", "pubOnlySecret"), ("freeAdmin", "freeAdminSecret"), ("nobody01", "whatever1")]
    names = ["topicA", "topicB", "topicC", "topicZ", "%RETRY%groupB", "%RETRY%groupA", "secretT",
             "RMQ_SYS_TRACE_TOPIC", None]
    groups = ["groupA", "groupB", "groupC", "groupZ", None]
    codes = [R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.PULL_MESSAGE, R.SEND_MESSAGE, R.QUERY_MESSAGE,
             R.UPDATE_AND_CREATE_TOPIC, R.CONSUMER_SEND_MSG_BACK]
    seen = 0
    for _ in range(4000):
        code = int(rng.choice(codes))
        topic, group = rng.choice(names), rng.choice(groups)
        if code == R.PULL_MESSAGE or code == R.QUERY_MESSAGE:
            ext = {"topic": topic, "consumerGroup": group}
        elif code == R.SEND_MESSAGE or (code == R.SEND_BATCH_MESSAGE and rng.random() < 0.5):
            ext = {"topic": topic, "group": group}
        else:
            ext = {"a": group, "b": topic, "e": str(rng.randrange(4))}
        ext = {k: v for k, v in ext.items() if v is not None}
        body = rng.choice([None, b"", b"body", b"other"])
        ak, sk = rng.choice(accounts)
        msg = signed(ext, body, ak, sk) if rng.random() < 0.9 else dict(ext)
        r = rng.random()
        if r < 0.1:
            msg = dict(msg, Signature="AAAAAAAAAAAAAAAAAAAAAAAAAAA=")
        elif r < 0.15:
            body = (body or b"") + b"!"
        elif r < 0.2 and msg:
            k = rng.choice(sorted(msg))
            msg = dict(msg, **{k: str(msg[k]) + "x"})
        ip = rng.choice(["1.1.1.1", "192.168.0.7", "192.168.1.9"])
        want = A.check(t, code, msg, body, ip)
        got = fast(code, msg, body, ip)
        assert got == want, (code, msg, body, ip)
        seen += want is None
    assert seen > 500     # allowed requests were repeated: kept decisions were exercised


def test_checker_keeps_a_bounded_number_of_decisions(monkeypatch):
    monkeypatch.setattr(A, "_DECIDED_MAX", 8)
    t = A.build_table([A.parse_acl_file(NO_GLOBAL_WHITE, "/conf/plain_acl.yml")])
    fast = A.checker(t)
    for i in range(50):
        # an admin without resource perms may send anywhere: every topic a kept decision
        assert fast(R.SEND_MESSAGE_V2, signed({"b": f"t{i}"}, b"m", "freeAdmin", "freeAdminSecret"), b"m",
                    "1.1.1.1") is None
        assert 1 <= len(fast.decided) <= 8
        # denied decisions are never kept
        assert fast(R.SEND_MESSAGE_V2, signed({"b": f"t{i}"}, b"m", "adminWithPerms", "adminSecret"), b"m",
                    "1.1.1.1").reason == "default_perm"
    assert all(k[0] == "freeAdmin" for k in fast.decided)


def test_checker_keys_hold_only_what_the_decision_reads():
    # a publisher sending to one topic with a new producer group each time (or names past
    # RocketMQ's limits) must not grow the kept decisions: the group counts only for a
    # %RETRY% topic, and long names are decided by check every time
    t = A.build_table([A.parse_acl_file(NO_GLOBAL_WHITE, "/conf/plain_acl.yml")])
    fast = A.checker(t)
    for i in range(100):
        ext = signed({"a": f"group-{i}-" + "g" * 200, "b": "topicB"}, b"m", "freeAdmin", "freeAdminSecret")
        assert fast(R.SEND_MESSAGE_V2, ext, b"m", "1.1.1.1") is None
    assert len(fast.decided) == 1
    for i in range(3):
        ext = signed({"a": f"g{i}", "b": f"%RETRY%g{i}"}, b"m", "freeAdmin", "freeAdminSecret")
        assert fast(R.SEND_MESSAGE_V2, ext, b"m", "1.1.1.1") is None
    assert len(fast.decided) == 4
    long_topic = signed({"b": "t" * 300}, b"m", "freeAdmin", "freeAdminSecret")
    assert fast(R.SEND_MESSAGE_V2, long_topic, b"m", "1.1.1.1") is None
    assert fast(R.PULL_MESSAGE, signed({"topic": "x", "consumerGroup": "g" * 256}, None, "freeAdmin",
                                       "freeAdminSecret"), None, "1.1.1.1") is None
    assert len(fast.decided) == 4


def test_non_str_keys_are_a_bad_signature_not_a_crash(table):
    # a msgpack header may carry a bytes key beside str ones: they do not sort together
    ext = signed({"b": "topicB"}, b"m")
    ext[b"raw"] = "x"
    for decide in (lambda: A.check(table, R.SEND_MESSAGE_V2, ext, b"m", "1.1.1.1"),
                   lambda: A.checker(table)(R.SEND_MESSAGE_V2, ext, b"m", "1.1.1.1")):
        assert decide().reason == "signature"


# --- the admin codes' edits -------------------------------------------------------------------

def test_update_account_keeps_the_others_and_bumps_the_version():
    cfg = A.account_config({"accessKey": "newUser01", "secretKey": "newSecret01", "admin": "false",
                            "defaultTopicPerm": "PUB", "topicPerms": "t1=PUB,t2=SUB", "groupPerms": "g=SUB"})
    text = A.updated_account_yaml(SAMPLE, "p.yml", cfg, (5, 7), 1000)
    f = A.parse_acl_file(text, "p.yml")
    assert [a.access_key for a in f.accounts] == [AK, "rocketmq2", "adminWithPerms", "newUser01"]
    assert f.version == (1000, 8)
    assert f.accounts[3].perms == {"t1": A.PUB, "t2": A.SUB, "%RETRY%g": A.SUB}
    assert [p.text for p in f.global_white] == ["10.10.103.*", "192.168.0.*"]
    # update: given fields replace, others stay
    text2 = A.updated_account_yaml(text, "p.yml", A.account_config({"accessKey": AK, "secretKey": "changed99",
                                                                    "defaultTopicPerm": "SUB"}), f.version, 2000)
    f2 = A.parse_acl_file(text2, "p.yml")
    a = next(a for a in f2.accounts if a.access_key == AK)
    assert a.secret_key == "changed99" and a.default_topic_perm == A.SUB and a.perms["topicB"] == A.PUB | A.SUB
    with pytest.raises(ValueError, match="The accessKey=short and secretKey=12345678 cannot be null"):
        A.updated_account_yaml(text, "p.yml", A.account_config({"accessKey": "short", "secretKey": "12345678"}),
                               (0, 0), 1)
    with pytest.raises(ValueError, match="Parse resource permission error for t=ALL"):
        A.updated_account_yaml(text, "p.yml", A.account_config({"accessKey": "abcdefgh", "secretKey": "abcdefgh",
                                                                "topicPerms": "t=ALL"}), (0, 0), 1)


def test_delete_account_and_global_white():
    text = A.deleted_account_yaml(SAMPLE, "p.yml", "rocketmq2", (0, 0), 5)
    f = A.parse_acl_file(text, "p.yml")
    assert [a.access_key for a in f.accounts] == [AK, "adminWithPerms"]
    assert A.deleted_account_yaml(SAMPLE, "p.yml", "nobody99", (0, 0), 5) is None
    text = A.updated_global_white_yaml(SAMPLE, "p.yml", ["1.2.3.*", "::1"], (0, 3), 9)
    f = A.parse_acl_file(text, "p.yml")
    assert [p.text for p in f.global_white] == ["1.2.3.*", "::1"] and f.version == (9, 4)
    with pytest.raises(ValueError):
        A.updated_global_white_yaml(SAMPLE, "p.yml", ["nonsense"], (0, 0), 1)
