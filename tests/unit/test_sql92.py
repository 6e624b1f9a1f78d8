"""The SQL92 filter (broker/core/sql92.py): expressions x property sets -> Java's result,
parse errors with their positions, the cache, and the store's record filter."""
from __future__ import annotations

import pytest

from pocketmq.broker.core.sql92 import ExpressionCache, ParseError, compile_expression
from pocketmq.broker.store.api import GetMessageStatus as GS
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import (MessageSysFlag, decode_records, encode_properties, encode_record,
                                       properties_at)

T, F, U = True, False, None      # U: unknown (SQL NULL); a message matches only on T

EU7 = {"a": "7", "region": "eu", "TAGS": "TagA"}
US3 = {"a": "3", "region": "us", "TAGS": "TagB"}
NONE: dict = {}
TEXT = {"a": "seven", "region": "eu"}
FLOATY = {"a": "7.5", "region": "eu"}
BIG = {"a": "3000000000"}
QUOTE = {"s": "it's", "b": "TRUE", "neg": "-5"}

# (expression, properties, expected evaluate() result)
TABLE = [
    # comparisons on numbers: the property text is converted to the literal's type
    ("a > 5", EU7, T), ("a > 5", US3, F), ("a > 5", NONE, U),
    ("a >= 7", EU7, T), ("a < 7", EU7, F), ("a <= 7", EU7, T), ("a = 7", EU7, T), ("a <> 7", EU7, F),
    ("a > 5.5", EU7, T), ("a > 5.5", FLOATY, T), ("a = 7.5", FLOATY, T),
    ("a = 7.0", EU7, T),                  # Double.valueOf("7") == 7.0
    ("a > 5", FLOATY, F),                 # Integer.valueOf("7.5") throws: not matched...
    ("a > 5 OR region = 'eu'", FLOATY, F),    # ...even under an OR (Java aborts the evaluation)
    ("region = 'eu' OR a > 5", FLOATY, T),    # OR stops at its first TRUE
    ("a > 5", TEXT, F), ("a = 5", TEXT, F),
    ("a > 5", BIG, F),                    # Integer.valueOf refuses 3000000000
    ("a > 2999999999", BIG, T),           # a long literal: Long.valueOf
    ("a > 5L", EU7, T),                   # 5L is still an Integer (it fits)
    ("-5 = neg", QUOTE, T), ("neg = -5", QUOTE, T), ("neg < -4", QUOTE, T), ("+7 = a", EU7, T),
    ("a > 1E0", EU7, T), ("a < .5E2", EU7, T), ("a > 5.", EU7, T),
    ("0 < a", EU7, T), ("8 > a", EU7, T),
    ("a > region", EU7, F),               # two strings ordered: both parsed as doubles; 'eu' fails
    ("a < b", {"a": "2", "b": "10"}, T),  # ...numerically, not as text
    # strings: = and <> compare text
    ("region = 'eu'", EU7, T), ("region = 'EU'", EU7, F), ("region <> 'eu'", US3, T),
    ("region = 'eu'", NONE, U), ("region <> 'eu'", NONE, U),
    ("'eu' = region", NONE, F),           # Java's asymmetry: a missing right side is FALSE...
    ("'eu' <> region", NONE, T),          # ...so its negation is TRUE
    ("s = 'it''s'", QUOTE, T), ("s = 'it''s' AND 'x' = 'x'", QUOTE, T),
    ("region = a", EU7, F), ("region = region", EU7, T),
    # booleans
    ("TRUE", NONE, T), ("FALSE", NONE, F), ("NULL", NONE, U), ("NOT TRUE", NONE, F),
    ("b = TRUE", QUOTE, T), ("b = FALSE", QUOTE, F), ("b <> TRUE", QUOTE, F),
    ("s = TRUE", QUOTE, F),               # Boolean.valueOf("it's") is false
    ("b", QUOTE, F),                      # a property used as a condition: a string is not a Boolean
    ("b", NONE, U), ("NOT b", NONE, U),
    ("TRUE = TRUE", NONE, T), ("TRUE = FALSE", NONE, F), ("TRUE = b", QUOTE, F),  # Boolean vs String throws
    # BETWEEN / NOT BETWEEN (a >= low AND a <= high / a < low OR a > high)
    ("a BETWEEN 1 AND 7", EU7, T), ("a BETWEEN 8 AND 9", EU7, F), ("a BETWEEN 1 AND 7", NONE, U),
    ("a NOT BETWEEN 1 AND 5", EU7, T), ("a NOT BETWEEN 1 AND 7", EU7, F), ("a NOT BETWEEN 1 AND 7", NONE, U),
    ("a BETWEEN 7.0001 AND 8", EU7, F), ("a BETWEEN -1 AND 7", EU7, T),
    ("a not between 9 and 1", EU7, T),    # NOT BETWEEN does not check the order
    # IN / NOT IN: strings only
    ("region IN ('eu', 'us')", EU7, T), ("region IN ('asia')", EU7, F), ("region IN ('eu')", NONE, U),
    ("region NOT IN ('asia', 'us')", EU7, T), ("region NOT IN ('eu')", EU7, F),
    ("region NOT IN ('eu')", NONE, U), ("a IN ('7')", EU7, T),
    ("TAGS IN ('TagA', 'TagC', 'TagD', 'TagE', 'TagF')", EU7, T),
    # IS [NOT] NULL
    ("a IS NULL", NONE, T), ("a IS NULL", EU7, F), ("a IS NOT NULL", EU7, T), ("a IS NOT NULL", NONE, F),
    ("(a > 5) IS NULL", NONE, T), ("NULL IS NULL", NONE, T), ("5 IS NOT NULL", NONE, T),
    # three-valued AND / OR / NOT
    ("a > 5 AND region = 'eu'", EU7, T), ("a > 5 AND region = 'eu'", US3, F),
    ("a > 5 AND region = 'eu'", {"region": "eu"}, U), ("a > 5 AND region = 'eu'", {"region": "us"}, F),
    ("a > 5 OR region = 'eu'", {"region": "eu"}, T), ("a > 5 OR region = 'eu'", {"region": "us"}, U),
    ("a > 5 OR region = 'eu'", US3, F),
    ("NOT (a > 5)", EU7, F), ("NOT (a > 5)", US3, T), ("NOT (a > 5)", NONE, U),
    ("NOT NOT (a > 5)", EU7, T),
    # precedence: AND before OR, comparisons before both, parentheses first
    ("region = 'us' OR region = 'eu' AND a > 100", US3, T),
    ("region = 'us' OR region = 'eu' AND a > 100", EU7, F),
    ("(region = 'us' OR region = 'eu') AND a > 100", EU7, F),
    ("(region = 'us' OR region = 'eu') AND a > 5", EU7, T),
    ("a > 5 = TRUE", EU7, T),              # (a > 5) = TRUE
    # TAGS is a property; keywords are case-insensitive, names are not
    ("TAGS = 'TagA'", EU7, T), ("tags = 'TagA'", EU7, U),
    ("a > 5 and REGION = 'eu'", EU7, U), ("a > 5 aNd region = 'eu' Or FALSE", EU7, T),
    # comments and white space
    ("a > 5 -- note\n AND region = 'eu'", EU7, T), ("a /* x */ > 5", EU7, T), ("\ta\r\n>\f5", EU7, T),
    # identifiers with $ and _
    ("$x_1 = 'y'", {"$x_1": "y"}, T), ("_a IS NULL", NONE, T),
    # special doubles: Java's Double.valueOf grammar
    ("a > 1.5", {"a": "NaN"}, T),          # NaN sorts above everything in Double.compare
    ("a > 1.5", {"a": "Infinity"}, T), ("a < 1.5", {"a": "-Infinity"}, T),
    ("a > 1.5", {"a": "inf"}, F),          # Python's spelling is not Java's
    ("a > 1.5", {"a": "2_0"}, F), ("a = 2.5", {"a": " 2.5 "}, T), ("a = 2.5", {"a": "2.5d"}, T),
    ("a = 3.0", {"a": "0x1.8p1"}, T),
    ("a = 7", {"a": " 7"}, F), ("a = 7", {"a": "+7"}, T), ("a = 7", {"a": "٧"}, T),  # Integer.valueOf
]


@pytest.mark.parametrize("text, props, want", TABLE)
def test_table(text, props, want):
    e = compile_expression(text)
    assert e.evaluate(props) is want
    assert e.matches(encode_properties(props)) is (want is True)


PARSE_ERRORS = [
    # (expression, line, column, words the message names)
    ("a >", 1, 4, "end of input"),
    ("a > 5 AND", 1, 10, "end of input"),
    ("(a > 5", 1, 7, ")"),
    ("a > 5)", 1, 6, "')'"),
    ("a = 1 b = 2", 1, 7, "'b'"),           # Java silently ignores the rest; we refuse it
    ("a > 'x'", 1, 5, "cannot be compared"),
    ("'x' < a", 1, 1, "cannot be compared"),
    ("a > TRUE", 1, 5, "cannot be compared"),
    ("NOT a > 5", 1, 1, "cannot be compared"),   # NOT binds tighter: (NOT a) > 5
    ("a = NULL", 1, 5, "IS NULL"),
    ("a <> NULL", 1, 6, "IS NULL"),
    ("TRUE = 'x'", 1, 6, "cannot be compared"),
    ("a BETWEEN 5 AND 1", 1, 3, "less than or equal"),
    ("a BETWEEN 1", 1, 12, "AND"),
    ("a BETWEEN NULL AND 5", 1, 3, "NULL"),
    ("a IN (1, 2)", 1, 7, "string literal"),
    ("a IN ('x' 'y')", 1, 11, ","),
    ("'x' IN ('x')", 1, 5, "property"),
    ("5", 1, 1, "boolean"),
    ("'abc'", 1, 1, "boolean"),
    ("a > 5 AND 7", 1, 11, "boolean"),
    ("a IS 5", 1, 6, "NULL"),
    ("a IS NOT 5", 1, 10, "NULL"),
    ("a # 5", 1, 3, "'#'"),
    ("region = 'eu", 1, 10, "unterminated"),
    ("a > 0.0", 1, 5, "smallest"),          # Java refuses literals below Double.MIN_VALUE
    ("a > 1e999", 1, 5, "largest"),
    ("a > 99999999999999999999", 1, 5, "range"),
    ("a > 5 --no newline", 1, 7, "'-'"),    # a line comment needs its line end
    ("a > 5\nAND b <", 2, 8, "end of input"),
    ("a > 5\n  AND (b ~ 1)", 2, 10, "'~'"),
    ("", 1, 1, "empty"),
    ("   ", 1, 1, "empty"),
    ("a LIKE 'x'", 1, 3, "'LIKE'"),
    ("a > 5 AND region = ", 1, 20, "end of input"),     # just past the end
]


@pytest.mark.parametrize("text, line, column, words", PARSE_ERRORS)
def test_parse_errors_name_line_and_column(text, line, column, words):
    with pytest.raises(ParseError) as ei:
        compile_expression(text)
    e = ei.value
    assert (e.line, e.column) == (line, column), str(e)
    assert words in str(e)
    assert (f"line {line}, column {column}" if line > 1 else f"column {column}") in str(e)


def test_expected_tokens_are_named():
    with pytest.raises(ParseError, match=r"found end of input, expected a literal, a property name"):
        compile_expression("a = ")
    with pytest.raises(ParseError, match=r"found 'b', expected AND, OR, a comparison or the end"):
        compile_expression("a = 1 b")


def test_cache_compiles_once_keeps_errors_and_is_bounded():
    cache = ExpressionCache(max_entries=2)
    e1 = cache("a > 1")
    assert cache("a > 1") is e1
    with pytest.raises(ParseError) as first:
        cache("a >")
    with pytest.raises(ParseError) as again:
        cache("a >")
    assert again.value is first.value               # the error is cached too
    cache("a > 2")
    assert len(cache) == 2
    assert cache("a > 1") is not e1                 # evicted (least recently used), compiled anew
    assert cache("a > 2") is not None and len(cache) == 2


def record(props: dict, sys_flag: int = 0, body: bytes = b"body") -> bytes:
    born = (b"\0" * 15 + b"\1", 7) if sys_flag & MessageSysFlag.BORNHOST_V6_FLAG else (b"\x0a\0\0\7", 7)
    store = (b"\0" * 15 + b"\2", 9) if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG else (b"\x0a\0\0\1", 9)
    return encode_record("T", 0, 0, body, encode_properties(props), sys_flag, 1, born, store, 0, 0, 0, 0, 2)


@pytest.mark.parametrize("sys_flag", [0, MessageSysFlag.BORNHOST_V6_FLAG,
                                      MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG])
def test_record_filter_reads_the_properties_in_place(sys_flag):
    r = record({"a": "7", "r": "é"}, sys_flag, body=b"x" * 300)
    buf = memoryview(b"\0" * 5 + r + b"\0" * 3)
    assert properties_at(buf, 5) == encode_properties({"a": "7", "r": "é"}).encode()
    assert compile_expression("a > 5 AND r = 'é'").match_record(buf, 5)
    with pytest.raises(ParseError, match="column 12"):
        compile_expression("a > 5 AND région = 'é'")       # names are ASCII, as in Java
    assert not compile_expression("a > 7").match_record(buf, 5)
    assert not compile_expression("a > 5").match_record(record({}), 0)
    assert properties_at(record({})) == b""


def _put_all(store, rows):
    for i, props in enumerate(rows):
        r = store.put_message(MessageToStore("T", 0, 0, b"m%d" % i, encode_properties(props), 0, 1,
                                             (b"\x0a\0\0\7", 7), 1000 + i))
        assert r.wrote_offset >= 0
    if hasattr(store, "reput"):
        store.reput()


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_store_get_message_with_record_filter(tmp_path, kind):
    cfg = StoreConfig(str(tmp_path / "s"), mapped_file_size_commit_log=1 << 16,
                      store_host=(b"\x0a\0\0\1", 10911), total_physical_memory_bytes=1 << 34)
    store = MessageStore(cfg) if kind == "file" else MemoryStore(cfg)
    store.open()
    try:
        rows = [{"a": str(i)} if i % 4 else {} for i in range(20)]
        _put_all(store, rows)
        keep = compile_expression("a >= 10").match_record
        r = store.get_message("T", 0, 0, 32, None, keep)
        assert r.status is GS.FOUND and r.next_begin_offset == 20
        got = [m.body for m in decode_records(b"".join(bytes(b) for b in r.buffers))]
        assert got == [b"m%d" % i for i in range(10, 20) if i % 4]
        # the record filter counts toward the batch like Java's: 2 messages, then stop
        r = store.get_message("T", 0, 0, 2, None, keep)
        assert r.message_count == 2 and r.next_begin_offset == 12
        # nothing matches: NO_MATCHED_MESSAGE, and the offset still moves past the scanned ones
        r = store.get_message("T", 0, 3, 32, None, compile_expression("a > 100").match_record)
        assert r.status is GS.NO_MATCHED_MESSAGE and r.next_begin_offset == 20 and r.message_count == 0
    finally:
        store.close()


VALUES = ["0", "1", "5", "7", "-3", "+7", "007", "5.5", "7.0", "1e1", "NaN", "Infinity", "-0", "x", "", " 7",
          "٧", "2147483648", "9223372036854775808", "3000000000", "eu", "us", "EU", "é", "\ufffd", "TRUE", "true"]
EQUIVALENT = [
    # a fast path (property OP literal, one lookup) against Java's general form
    ("a BETWEEN 1 AND 7", "1 <= a AND 7 >= a"),
    ("a NOT BETWEEN 1 AND 7", "1 > a OR 7 < a"),
    ("a BETWEEN 1 AND 3000000000", "1 <= a AND 3000000000 >= a"),
    ("a > 5", "5 < a"), ("a >= 5.5", "5.5 <= a"), ("a < 3000000000", "3000000000 > a"), ("a <= 7", "7 >= a"),
    ("a = 'eu'", "'eu' = a"), ("a = '\ufffd'", "'\ufffd' = a"), ("a <> 'x'", "'x' <> a"),
    ("a IN ('eu', 'us', '7')", "a = 'eu' OR a = 'us' OR a = '7'"),
    ("a NOT IN ('eu', '\ufffd')", "NOT (a = 'eu' OR a = '\ufffd')"),
]


@pytest.mark.parametrize("fast, general", EQUIVALENT)
def test_fast_paths_agree_with_the_general_form(fast, general):
    f, g = compile_expression(fast), compile_expression(general)
    for v in VALUES:
        if not v:
            continue        # missing: the general forms put the literal first, where it is FALSE, not unknown
        props = {"a": v}
        assert f.evaluate(props) is g.evaluate(props), (fast, general, v)
        assert f.matches(encode_properties(props)) is g.matches(encode_properties(props)), (fast, general, v)
    broken = b"a\x01\xff\xfe"                  # invalid UTF-8 is decoded with replacement, like Java
    assert f.evaluate(broken) is g.evaluate(broken), (fast, general)
