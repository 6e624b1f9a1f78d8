"""The broker's per-pull header fast paths, pinned to the plain paths they shortcut:
decode_pull_header (fast) against decode_pull_header_checked (field by field), the memo of
valid names in check_ext_names against name_error, and the pull processor's memo of
subscriptions carried by pull headers against build_subscription."""
import random

import pytest

from pocketmq.broker.processors import pull as pull_proc
from pocketmq.protocol.bodies import build_subscription
from pocketmq.protocol.codes import PullSysFlag, ResponseCode
from pocketmq.protocol.errors import HeaderError
from pocketmq.protocol.headers import typed
from pocketmq.protocol.headers.typed import (PullMessageRequestHeader, check_ext_names,
                                             decode_pull_header, decode_pull_header_checked)
from pocketmq.protocol.names import EXT_NAME_FIELDS, name_error

PULL = {"consumerGroup": "G1", "topic": "T1", "queueId": "3", "queueOffset": "1234",
        "maxMsgNums": "32", "sysFlag": "3", "commitOffset": "77", "suspendTimeoutMillis": "20000",
        "subscription": "a || b", "subVersion": "1700000000000", "expressionType": "TAG"}

# values each field may take: good ones, edge ones and broken ones
_VALUES = ["0", "-1", "1", " 7", "+5", "1_000", "", "x", "1.5", None, str(2**31 - 1), str(2**31),
           str(-2**31), str(-2**31 - 1), str(2**63 - 1), str(2**63), str(-2**63), str(-2**63 - 1),
           "٣"]


def _outcome(fn, ext):
    try:
        return ("ok", fn(ext))
    except HeaderError as e:
        return ("error", str(e))


def test_pull_header_fast_path_is_the_checked_one_for_every_field_value():
    fields = list(PULL) + ["missing"]
    cases = 0
    for field in fields:
        for v in _VALUES:
            ext = dict(PULL)
            if field == "missing":
                continue
            if v is None:
                del ext[field]
            else:
                ext[field] = v
            assert _outcome(decode_pull_header, ext) == _outcome(decode_pull_header_checked, ext), (field, v)
            ext[field] = None       # a JSON null
            assert _outcome(decode_pull_header, ext) == _outcome(decode_pull_header_checked, ext), (field, "null")
            cases += 2
    assert cases > 300


def test_pull_header_fast_path_random_headers():
    rng = random.Random(7)
    for _ in range(3000):
        ext = {k: rng.choice(_VALUES + [v, v, v]) for k, v in PULL.items()}
        ext = {k: v for k, v in ext.items() if v is not None or rng.random() < 0.5}
        assert _outcome(decode_pull_header, ext) == _outcome(decode_pull_header_checked, ext), ext


def test_pull_header_fast_path_values():
    h = decode_pull_header(PULL)
    assert h == PullMessageRequestHeader("G1", "T1", 3, 1234, 32, 3, 77, 20000, "a || b", 1700000000000, "TAG")
    # optional fields absent or "" (the C++ client) take their defaults
    ext = dict(PULL, subVersion="", expressionType="")
    del ext["subscription"]
    h = decode_pull_header(ext)
    assert (h.sub_version, h.expression_type, h.subscription) == (0, None, None)


@pytest.fixture
def fresh_names(monkeypatch):
    monkeypatch.setattr(typed, "_names_seen", {})
    return typed


def test_names_memo_refuses_what_name_error_refuses_every_time(fresh_names):
    bad = {"topic": "bad topic!", "consumerGroup": "G"}
    for _ in range(3):      # never remembered: refused each time, naming the field
        with pytest.raises(HeaderError, match="topic"):
            check_ext_names(bad)
    check_ext_names({"topic": "T", "consumerGroup": "G"})
    assert fresh_names._names_seen["topic"] == {"T"}
    # a name valid for one kind is not taken as valid for another
    long_group = "g" * 300          # longer than any name may be
    with pytest.raises(HeaderError):
        check_ext_names({"clientID": long_group})


def test_names_memo_matches_name_error_over_fuzzed_names(fresh_names):
    rng = random.Random(3)
    alphabet = "abcXYZ019_-%| .\t@é\u0000"
    for _ in range(2000):
        field, kind = rng.choice(EXT_NAME_FIELDS)
        v = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        if rng.random() < 0.05:
            v = "a" * rng.choice([127, 128, 255, 256])
        expected = name_error(kind, field, v)
        for _ in range(2):      # second time: through the memo when it was valid
            if expected is None:
                check_ext_names({field: v})
            else:
                with pytest.raises(HeaderError) as e:
                    check_ext_names({field: v})
                assert str(e.value) == expected


def test_names_memo_is_bounded(fresh_names, monkeypatch):
    monkeypatch.setattr(typed, "NAMES_SEEN_MAX", 10)
    for i in range(35):
        check_ext_names({"topic": f"T{i}"})
        assert len(fresh_names._names_seen["topic"]) <= 10


class _H:
    def __init__(self, **kw):
        self.__dict__.update(dict(topic="T1", subscription="a || b", expression_type="TAG",
                                  sub_version=5, sys_flag=PullSysFlag.SUBSCRIPTION, consumer_group="G"), **kw)


class _Ctx:
    class config:
        enablePropertyFilter = True


@pytest.fixture
def fresh_subs(monkeypatch):
    monkeypatch.setattr(pull_proc, "_pull_subs", {})
    return pull_proc


def test_pull_subscription_memo_gives_what_build_subscription_gives(fresh_subs):
    for expr, et in [("a || b", "TAG"), ("*", "TAG"), ("", None), ("a>5", "SQL92"), (" x ||  y ", "tag")]:
        h = _H(subscription=expr, expression_type=et)
        first, err = fresh_subs.resolve_subscription(_Ctx, h)
        assert err is None
        again, _ = fresh_subs.resolve_subscription(_Ctx, h)
        assert again is first           # built once
        assert first == build_subscription("T1", expr, et, 5)
    # another version, topic or expression is another entry
    a, _ = fresh_subs.resolve_subscription(_Ctx, _H(sub_version=6))
    b, _ = fresh_subs.resolve_subscription(_Ctx, _H(topic="T2"))
    assert a.sub_version == 6 and b.topic == "T2"


def test_pull_subscription_memo_does_not_remember_errors_and_is_bounded(fresh_subs, monkeypatch):
    for _ in range(2):
        sub, err = fresh_subs.resolve_subscription(_Ctx, _H(subscription="||", expression_type="TAG"))
        assert sub is None and err[0] == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert fresh_subs._pull_subs == {}
    monkeypatch.setattr(pull_proc, "PULL_SUBS_MAX", 4)
    for i in range(13):
        sub, err = fresh_subs.resolve_subscription(_Ctx, _H(sub_version=i))
        assert err is None and sub.sub_version == i
        assert len(fresh_subs._pull_subs) <= 4
