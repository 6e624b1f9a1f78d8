"""The plain-ACL request signature (protocol/acl.py) against vectors computed independently
with `openssl dgst -sha1 -hmac KEY -binary | base64` over the content written out by hand."""
from __future__ import annotations

from pocketmq.protocol.acl import combine_request_content, sign, sign_request, signature_matches


def test_vector_with_javascript_booleans_and_numbers():
    # as ali-ons sends SEND_MESSAGE_V2: JSON false and 1 in extFields, signed as "false", "1"
    ext = {"a": "pg", "b": "TopicTest", "k": False, "e": 1, "AccessKey": "RocketMQ", "Signature": "x",
           "_UNIQUE_KEY_QUERY": "ignored"}
    # sorted keys: AccessKey, a, b, e, k -> values RocketMQ pg TopicTest 1 false
    assert combine_request_content(ext, None) == b"RocketMQpgTopicTest1false"
    ext2 = {"x1": "RocketMQ", "x2": False, "x3": 1, "x4": "TopicTest", "x5": "pg"}
    assert sign(combine_request_content(ext2, b""), "12345678") == "gergUNAaVGgt9wIfhobqXjG3Xy4="


def test_vector_with_non_ascii_values_and_a_binary_body():
    ext = {"AccessKey": "AK1234567", "z": "héllo"}
    body = b"\x00\x01\xffbody"
    assert sign(combine_request_content(ext, body), "sk-secret") == "ccxwtaEVClwfuGPypBCYj2o5mzo="


def test_vector_empty():
    assert sign(combine_request_content({}, None), "abcdefg") == "J6GglN4puMPr43Mujc8Y7NAd8zw="
    assert sign(combine_request_content({"Signature": "s"}, b""), "abcdefg") == "J6GglN4puMPr43Mujc8Y7NAd8zw="


def test_sign_request_round_trip_and_tampering():
    ext = sign_request({"topic": "T", "queueId": "1"}, b"payload", "RocketMQ", "12345678", ons_channel="ALIYUN")
    assert ext["AccessKey"] == "RocketMQ" and ext["OnsChannel"] == "ALIYUN"
    assert signature_matches(ext, b"payload", "12345678")
    assert not signature_matches(ext, b"payload!", "12345678")
    assert not signature_matches(ext, b"payload", "12345679")
    assert not signature_matches({**ext, "topic": "U"}, b"payload", "12345678")
    assert not signature_matches({k: v for k, v in ext.items() if k != "Signature"}, b"payload", "12345678")
    assert not signature_matches({**ext, "Signature": 5}, b"payload", "12345678")


def _plain_signature(ext: dict, body, secret: str) -> str:
    # the rule written out the slow, obvious way: the reference the fast path is pinned to
    import base64
    import hashlib
    import hmac
    from pocketmq.protocol.acl import field_text
    text = "".join(field_text(ext[k]) for k in sorted(ext) if k not in ("Signature", "_UNIQUE_KEY_QUERY"))
    mac = hmac.new(secret.encode(), text.encode() + bytes(body or b""), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


def test_fast_path_equals_the_plain_rule_on_random_requests():
    # protocol/acl.py signs and checks with HMAC-SHA1 as two copied SHA-1 states (the
    # padded key's, RFC 2104; a key over SHA-1's 64-byte block hashed first), the signed
    # order kept per shape, and a plain join over str values: pinned here to hmac.new
    import random
    rnd = random.Random(32)
    alphabet = ["a", "b", "AccessKey", "Signature", "_UNIQUE_KEY_QUERY", "OnsChannel", "topic", "é", "Z", "k"]
    for _ in range(500):
        ext = {}
        for key in rnd.sample(alphabet, rnd.randrange(len(alphabet))):
            ext[key] = rnd.choice(["", "v", "héllo", "TopicTest", 1, False, True, 2.5, None]) \
                if rnd.random() < 0.3 else rnd.choice(["x", "yz", "ünï", "12"])
        body = rnd.choice([None, b"", b"\x00\xffbody", bytearray(b"ba"), memoryview(b"mv")])
        secret = rnd.choice(["12345678", "sk-secret", "ключ-1234", "k" * 64, "k" * 65, "ключ" * 40])
        want = _plain_signature(ext, body, secret)
        assert sign(combine_request_content(ext, body), secret) == want
        signed = sign_request({k: v for k, v in ext.items() if k != "AccessKey"}, body, "AK1234567", secret)
        assert signed["Signature"] == _plain_signature(signed, body, secret)
        assert signature_matches({**ext, "Signature": want}, body, secret)


def test_the_signed_order_per_shape_is_bounded_and_never_reuses_values():
    # protocol/acl.py keeps the signing order per shape of ext fields (their keys in arrival
    # order): values are read from each request, and hostile maps cannot grow the table
    from pocketmq.protocol import acl
    one = {"b": "1", "a": "2", "Signature": "s"}
    two = {"b": "3", "a": "4", "Signature": "s"}
    assert acl._fields_text(one) == b"21" and acl._fields_text(two) == b"43"
    for i in range(3 * acl._SHAPES_MAX):
        acl._fields_text({f"k{i}": "v", "a": "w"})
    assert len(acl._SHAPES) <= acl._SHAPES_MAX
    huge = {f"key{i:05d}": str(i) for i in range(acl._SHAPE_KEYS_MAX + 1)}
    assert acl._fields_text(huge) == "".join(str(i) for i in range(len(huge))).encode()
    assert tuple(huge) not in acl._SHAPES


def test_long_key_names_are_not_kept_as_shapes():
    from pocketmq.protocol import acl
    ext = {"k" * 2000: "v", "a": "w"}
    assert acl._fields_text(ext) == b"wv"
    assert tuple(ext) not in acl._SHAPES
