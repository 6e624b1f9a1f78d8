"""RocketMQ's SQL92 message filter: parser, Java's value rules, compiled evaluator (pure).

The dialect is RocketMQ 4.9's (filter module: SelectorParser.jj and the expression
classes, themselves ActiveMQ's JMS selectors cut down), learnt from its grammar and
rebuilt here:

    expr       := and_expr (OR and_expr)*
    and_expr   := equality (AND equality)*
    equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( ('>'|'>='|'<'|'<=') unary | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' string (',' string)* ')' )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | identifier | '(' expr ')'
    literal    := 'it''s' | 12 | 12L | 1.5 | .5 | 5E3 | TRUE | FALSE | NULL

Keywords are case-insensitive; identifiers are ASCII ``[A-Za-z_$][A-Za-z0-9_$]*``
(case-sensitive); ``--`` line and ``/* */`` block comments are skipped. NOT binds
tighter than comparisons (``NOT a > 1`` is an error; write ``NOT (a > 1)``).

Values follow Java. A message property is always a *string*; literals are Integer
(when the decimal fits 32 bits), Long, Double, Boolean or String. Comparing values of
different types converts the second to the first's type (``a > 5`` parses the
property with Integer.valueOf, ``a > 5.5`` with Double.valueOf, ``a = TRUE`` with
Boolean.valueOf); ``>``/``<`` between two strings compares them as doubles. A string
that does not convert makes the *whole* expression fail (Java throws; the message is
not matched), even under an OR. ``=``/``<>`` on strings compare text; IN takes
string literals only; a string literal may not be ordered (``a > 'x'`` is an error).

Three-valued logic: a comparison with a missing property is unknown (None); NOT
unknown is unknown; AND/OR as SQL; a message matches only when the result is TRUE.
Java's asymmetry is kept: ``a = 'x'`` is unknown when ``a`` is missing, but
``'x' = a`` is FALSE (so ``'x' <> a`` is TRUE).

Where we differ, on purpose: Java stops parsing at the first token that cannot
continue the expression and silently ignores the rest (``a = 1 b = 2`` is ``a = 1``);
here trailing input is a ParseError. Errors name the 1-based line and column
(tabs count as one column).

`compile_expression(text)` returns an `Expression` whose evaluator is a tree of
closures over the stored properties (the UTF-8 bytes of name\\x01value\\x02...), built
once; it reads only the properties the expression names (protocol.message's
property_getter) and decodes a value only when it must (text equality and IN compare
bytes, numbers parse ASCII digits directly).
`compiled(text)` is the same behind a bounded cache (errors cached too), the one
every broker path uses.
"""
from __future__ import annotations

import math
import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from itertools import compress, repeat
from operator import is_

from pocketmq.protocol.message import (encode_properties, properties_at, properties_at_many, property_getter,
                                       property_keys, property_slots, slot_names_ok)

__all__ = ["Expression", "ExpressionCache", "ParseError", "compile_expression", "compiled"]

_INT_MIN, _INT_MAX = -2**31, 2**31 - 1
_LONG_MIN, _LONG_MAX = -2**63, 2**63 - 1
_DOUBLE_MIN_VALUE = 5e-324          # Java's Double.MIN_VALUE: the smallest positive double


class ParseError(ValueError):
    """An SQL92 expression that does not compile: `message` names what was found and
    what was expected; `line` and `column` (1-based) point at it."""

    def __init__(self, message: str, line: int, column: int):
        self.message = message
        self.line = line
        self.column = column
        where = f"column {column}" if line == 1 else f"line {line}, column {column}"
        super().__init__(f"{message} at {where}")


class _EvalError(ValueError):
    """Java threw while evaluating (a string that does not convert): not matched."""


class JLong(int):
    """A Java Long value (a literal beyond 32 bits, or a property parsed as Long);
    plain int stands for Integer. The distinction matters: a property compared with an
    Integer is parsed with Integer.valueOf, which refuses what Long.valueOf accepts."""
    __slots__ = ()


# --------------------------------------------------------------------------- Java conversions

def _parse_int(s: str) -> int:
    """Integer.valueOf(String): optional sign, decimal digits, 32-bit range."""
    if s.isdecimal() or (len(s) > 1 and s[0] in "+-" and s[1:].isdecimal()):
        v = int(s)
        if _INT_MIN <= v <= _INT_MAX:
            return v
    raise _EvalError(f"For input string: {s!r}")


def _parse_long(s: str) -> JLong:
    if s.isdecimal() or (len(s) > 1 and s[0] in "+-" and s[1:].isdecimal()):
        v = int(s)
        if _LONG_MIN <= v <= _LONG_MAX:
            return JLong(v)
    raise _EvalError(f"For input string: {s!r}")


def _parse_int_b(v: bytes) -> int:
    """_parse_int of a raw property value: ASCII digits directly, anything else decoded."""
    if v.isdigit() or (len(v) > 1 and v[0] in b"+-" and v[1:].isdigit()):
        x = int(v)
        if _INT_MIN <= x <= _INT_MAX:
            return x
        raise _EvalError(f"For input string: {v!r}")
    return _parse_int(v.decode("utf-8", "replace"))


def _parse_long_b(v: bytes) -> JLong:
    if v.isdigit() or (len(v) > 1 and v[0] in b"+-" and v[1:].isdigit()):
        x = int(v)
        if _LONG_MIN <= x <= _LONG_MAX:
            return JLong(x)
        raise _EvalError(f"For input string: {v!r}")
    return _parse_long(v.decode("utf-8", "replace"))


def _parse_double_b(v: bytes) -> float:
    if not v.strip(b"0123456789.+-eE"):
        try:
            return float(v)
        except ValueError:
            raise _EvalError(f"For input string: {v!r}") from None
    return _parse_double(v.decode("utf-8", "replace"))


_JAVA_BLANK = "".join(chr(i) for i in range(33))       # String.trim() strips chars <= ' '
_PLAIN_FLOAT_CHARS = "0123456789.+-eE"
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:(NaN)|(Infinity)"
    r"|((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?"
    r"|(0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+)[fFdD]?)", re.ASCII)


def _parse_double(s: str) -> float:
    """Double.valueOf(String): Java's grammar (trimmed; NaN, Infinity, exponents, a
    d/f suffix, hex floats), not Python's (no 'inf', no underscores)."""
    if s and not s.strip(_PLAIN_FLOAT_CHARS):
        # only digits, dots, signs and exponents: Python's float() accepts exactly Java's subset
        try:
            return float(s)
        except ValueError:
            raise _EvalError(f"For input string: {s!r}") from None
    t = s.strip(_JAVA_BLANK)
    m = _JAVA_DOUBLE.fullmatch(t)
    if m is None:
        raise _EvalError(f"For input string: {s!r}")
    neg = t.startswith("-")
    if m.group(1):
        return math.nan
    if m.group(2):
        return -math.inf if neg else math.inf
    if m.group(3) is not None:
        v = float(m.group(3))
    else:
        v = float.fromhex(m.group(4))
    return -v if neg else v


def _dcmp(x: float, y: float) -> int:
    """Double.compare: NaN is above everything and equal to itself; -0.0 < 0.0."""
    if x < y:
        return -1
    if x > y:
        return 1
    if x == y:
        if x == 0.0:
            sx, sy = math.copysign(1.0, x), math.copysign(1.0, y)
            return 0 if sx == sy else (-1 if sx < sy else 1)
        return 0
    xn, yn = x != x, y != y
    return 0 if xn and yn else (1 if xn else -1)


def _compare_to(lv, rv) -> int:
    """lv.compareTo(rv) for two values of one Java type."""
    if type(lv) is float:
        return _dcmp(lv, rv)
    return -1 if lv < rv else (1 if lv > rv else 0)


def _jcompare(lv, rv) -> int:
    """ComparisonExpression.__compare with string conversion on (as SelectorParser sets
    it): values of different types are converted to the left one's type; a pair with no
    conversion compares as -1."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:
                raise _EvalError("Boolean cannot be cast to String")     # Java's own bug
            return -1
        if lt is int or lt is JLong:
            if rt is int or rt is JLong:
                pass                        # Integer and Long: both as long
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = _parse_int(rv) if lt is int else _parse_long(rv)
            else:
                return -1
        elif lt is float:
            if rt is int or rt is JLong:
                rv = float(rv)
            elif rt is str:
                rv = _parse_double(rv)
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = lv.lower() == "true"
            elif rt is int:
                lv = _parse_int(lv)
            elif rt is JLong:
                lv = _parse_long(lv)
            elif rt is float:
                lv = _parse_double(lv)
            else:
                return -1
        else:
            return -1
        if type(lv) is float or type(rv) is float:
            return _dcmp(float(lv), float(rv))
    return _compare_to(lv, rv)


def _order(lv, rv) -> int:
    """The compare of >, >=, <, <=: two strings are both parsed as doubles."""
    if type(lv) is str and type(rv) is str:
        return _dcmp(_parse_double(lv), _parse_double(rv))
    return _jcompare(lv, rv)


def _negate(v):
    t = type(v)
    if t is int:
        return ((-v - _INT_MIN) % 2**32) + _INT_MIN          # Java int overflow
    if t is JLong:
        return JLong(((-v - _LONG_MIN) % 2**64) + _LONG_MIN)
    if t is float:
        return -v
    return None                                              # not a Number


def _java_text(v) -> str:
    if v is None:
        return "NULL"
    if type(v) is bool:
        return "TRUE" if v else "FALSE"
    if type(v) is str:
        return "'" + v.replace("'", "''") + "'"
    return repr(v) if type(v) is float else str(int(v))


# --------------------------------------------------------------------------- lexer

_NOT, _AND, _OR, _BETWEEN, _IN, _TRUE, _FALSE, _NULL, _IS = (
    "NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS")
_KEYWORDS = frozenset({_NOT, _AND, _OR, _BETWEEN, _IN, _TRUE, _FALSE, _NULL, _IS})
_DECIMAL, _FLOAT, _STRING, _ID, _EOF = "<DECIMAL_LITERAL>", "<FLOATING_POINT_LITERAL>", "<STRING_LITERAL>", "<ID>", "<EOF>"
_OPERATORS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")

_RE_SPACE = re.compile(r"[ \t\n\r\f]+")
_RE_LINE_COMMENT = re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")
_RE_BLOCK_COMMENT = re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")
_RE_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*[lL]?)")
_RE_FLOAT = re.compile(r"(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)")
_RE_STRING = re.compile(r"'(?:''|[^'])*'")
_RE_ID = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


class _Token:
    __slots__ = ("column", "kind", "line", "text")

    def __init__(self, kind: str, text: str, line: int, column: int):
        self.kind, self.text, self.line, self.column = kind, text, line, column

    def describe(self) -> str:
        return "end of input" if self.kind == _EOF else repr(self.text)


def _tokenize(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\n|\r", text)]

    def where(pos: int) -> tuple[int, int]:
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, pos - line_starts[lo] + 1

    while True:
        while i < n:
            m = _RE_SPACE.match(text, i) or _RE_LINE_COMMENT.match(text, i) or _RE_BLOCK_COMMENT.match(text, i)
            if m is None:
                break
            i = m.end()
        if i >= n:
            out.append(_Token(_EOF, "", *where(n)))
            return out
        # longest match wins; on a tie the earlier kind (keywords, literals, then ID)
        best_kind, best_len = None, 0
        for kind, rx in ((_DECIMAL, _RE_DECIMAL), (_FLOAT, _RE_FLOAT), (_STRING, _RE_STRING), (_ID, _RE_ID)):
            m = rx.match(text, i)
            if m is not None and m.end() - i > best_len:
                best_kind, best_len = kind, m.end() - i
        for op in _OPERATORS:
            if text.startswith(op, i) and len(op) > best_len:
                best_kind, best_len = op, len(op)
        if best_kind is None:
            line, col = where(i)
            c = text[i]
            if c == "'":
                raise ParseError("unterminated string literal", line, col)
            raise ParseError(f"lexical error: unexpected character {c!r}", line, col)
        word = text[i:i + best_len]
        if best_kind == _ID and word.upper() in _KEYWORDS:
            best_kind = word.upper()
        out.append(_Token(best_kind, word, *where(i)))
        i += best_len


# --------------------------------------------------------------------------- compiled nodes
#
# A node is what Java's expression object is to its parser: the compiled evaluator
# (fn: the stored properties bytes -> value) plus the facts the grammar's checks look at: is it a
# BooleanExpression, a ConstantExpression (and its value), a PropertyExpression (name).

Fn = Callable[[str], object]


class _Node:
    __slots__ = ("const", "fn", "get", "is_bool", "is_const", "prop", "text", "tok")

    def __init__(self, fn: Fn, text: str, tok: _Token, *, is_bool: bool = False, is_const: bool = False,
                 const=None, prop: str | None = None, get=None):
        self.fn, self.text, self.tok = fn, text, tok
        self.is_bool, self.is_const, self.const, self.prop = is_bool, is_const, const, prop
        self.get = get      # a property: its raw getter (value bytes or None)


def _const_node(value, tok: _Token) -> _Node:
    return _Node(lambda p, v=value: v, _java_text(value), tok, is_bool=value is None or type(value) is bool,
                 is_const=True, const=value)


def _prop_node(name: str, tok: _Token) -> _Node:
    get = property_getter(name)

    def prop(p):
        v = get(p)
        return None if v is None else v.decode("utf-8", "replace")
    return _Node(prop, name, tok, prop=name, get=get)


def _bool_cast(n: _Node) -> Fn:
    # only a property is cast (the grammar's rule), and a property is a String, never a
    # Boolean: FALSE when present
    get = n.get

    def cast(p):
        return None if get(p) is None else False
    return cast


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokenize(text)
        self.i = 0
        self.names: dict[str, None] = {}       # the properties the expression reads, in order

    @property
    def tok(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, expected: str, tok: _Token | None = None):
        t = tok or self.tok
        raise ParseError(f"found {t.describe()}, expected {expected}", t.line, t.column)

    def error(self, message: str, tok: _Token):
        raise ParseError(message, tok.line, tok.column)

    def expect(self, kind: str, expected: str) -> _Token:
        if self.tok.kind != kind:
            self.fail(expected)
        return self.take()

    # -- grammar -----------------------------------------------------------------------
    def parse(self) -> _Node:
        n = self.or_expr()
        if self.tok.kind != _EOF:
            self.fail("AND, OR, a comparison or the end of the expression")
        return self.as_bool(n)

    def as_bool(self, n: _Node) -> _Node:
        if n.is_bool:
            return n
        if n.prop is not None:
            return _Node(_bool_cast(n), n.text, n.tok, is_bool=True)
        self.error(f"expression {n.text} will not result in a boolean value", n.tok)

    def or_expr(self) -> _Node:
        return self.junctions(self.and_expr, _OR, _or)

    def and_expr(self) -> _Node:
        return self.junctions(self.equality, _AND, _and)

    def junctions(self, operand, keyword: str, combine) -> _Node:
        """operand (keyword operand)*, left-associative; both sides must be conditions."""
        left = operand()
        while self.tok.kind == keyword:
            self.take()
            right = operand()
            left = combine(self.as_bool(left), self.as_bool(right))
        return left

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            k = self.tok.kind
            if k == "=" or k == "<>":
                op = self.take()
                right = self.comparison()
                self.check_equal_operand(left, op)
                self.check_equal_operand(right, op)
                if left.is_const and right.is_const and left.is_bool and not right.is_bool:
                    self.error(f"{left.text} cannot be compared with {right.text}", op)
                left = _equal(left, right, op)
                if k == "<>":
                    left = _not(left)
            elif k == _IS:
                self.take()
                negate = self.tok.kind == _NOT
                if negate:
                    self.take()
                self.expect(_NULL, "NULL" if negate else "NULL or NOT NULL")
                left = _is_null(left)
                if negate:
                    left = _not(left)
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            k = self.tok.kind
            if k in (">", ">=", "<", "<="):
                op = self.take()
                left = self.ordered(left, k, self.unary(), op)
            elif k == _BETWEEN or (k == _NOT and self.toks[self.i + 1].kind == _BETWEEN):
                op = self.tok
                negate = k == _NOT
                self.i += 2 if negate else 1
                low = self.unary()
                self.expect(_AND, "AND of BETWEEN")
                high = self.unary()
                if low.is_const and high.is_const and not negate:     # Java checks BETWEEN only
                    if low.const is None or high.const is None:
                        self.error("illegal values of BETWEEN: values can not be NULL", op)
                    try:
                        reversed_range = _jcompare(high.const, low.const) < 0
                    except _EvalError as e:
                        self.error(f"illegal values of BETWEEN: {e}", op)
                    if reversed_range:
                        self.error(f"illegal values of BETWEEN: left value ({low.text}) must be less than or "
                                   f"equal to right value ({high.text})", op)
                if negate:
                    both = _or(self.ordered(left, "<", low, op), self.ordered(left, ">", high, op))
                else:
                    both = _and(self.ordered(left, ">=", low, op), self.ordered(left, "<=", high, op))
                left = _between(left, low, high, negate, both)
            elif k == _IN or (k == _NOT and self.toks[self.i + 1].kind == _IN):
                op = self.tok
                negate = k == _NOT
                self.i += 2 if negate else 1
                self.expect("(", "( after IN")
                items = [self.string_literal()]
                while self.tok.kind == ",":
                    self.take()
                    items.append(self.string_literal())
                self.expect(")", ", or ) in the IN list")
                if left.prop is None:
                    self.error(f"expected a property for IN, got {left.text}", op)
                left = _in(left, items, negate, op)
            else:
                return left

    def string_literal(self) -> str:
        t = self.expect(_STRING, "a string literal")
        return t.text[1:-1].replace("''", "'")

    def unary(self) -> _Node:
        k = self.tok.kind
        if k == "+":
            self.take()
            return self.unary()
        if k == "-":
            op = self.take()
            return _negate_node(self.unary(), op)
        if k == _NOT:
            op = self.take()
            operand = self.unary()
            n = _not(self.as_bool(operand))
            n.tok, n.text = op, f"NOT {operand.text}"
            return n
        return self.primary()

    def primary(self) -> _Node:
        t = self.tok
        k = t.kind
        if k == _STRING:
            return _const_node(self.string_literal(), t)
        if k == _DECIMAL:
            self.take()
            digits = t.text[:-1] if t.text[-1] in "lL" else t.text
            v = int(digits)
            if v > _LONG_MAX:
                self.error(f"number {t.text} is out of the range of a long", t)
            return _const_node(v if v <= _INT_MAX else JLong(v), t)
        if k == _FLOAT:
            self.take()
            v = float(t.text)
            if v > 1.7976931348623157e308:
                self.error(f"{t.text} is greater than the largest double", t)
            if v < _DOUBLE_MIN_VALUE:       # Java's check: 0.0 is refused too
                self.error(f"{t.text} is less than the smallest positive double (4.9E-324)", t)
            return _const_node(v, t)
        if k == _TRUE or k == _FALSE or k == _NULL:
            self.take()
            return _const_node(None if k == _NULL else k == _TRUE, t)
        if k == _ID:
            self.take()
            self.names[t.text] = None
            return _prop_node(t.text, t)
        if k == "(":
            self.take()
            n = self.or_expr()
            self.expect(")", "AND, OR, a comparison or )")
            return n
        self.fail("a literal, a property name, NOT, + or - or (")

    # -- Java's construction-time checks ----------------------------------------------------
    def check_equal_operand(self, n: _Node, op: _Token) -> None:
        if n.is_const and n.const is None:
            self.error(f"NULL cannot be compared with {op.text} (use IS NULL)", n.tok)

    def ordered(self, left: _Node, sym: str, right: _Node, op: _Token) -> _Node:
        for n in (left, right):
            if (n.is_const and not (type(n.const) in (int, JLong, float))) or n.is_bool:
                self.error(f"value {n.text} cannot be compared with {sym}", n.tok)
        return _ordered(left, sym, right, op)


# --------------------------------------------------------------------------- node builders

def _not(n: _Node) -> _Node:
    f = n.fn

    def not_(p):
        v = f(p)
        return None if v is None else not v
    return _Node(not_, f"NOT ({n.text})", n.tok, is_bool=True)


def _junction(a: _Node, b: _Node, decisive: bool, word: str) -> _Node:
    """AND (decisive False) / OR (decisive True) in three-valued logic, as Java's
    LogicExpression: the right side is skipped once the left one decides."""
    fa, fb, other = a.fn, b.fn, not decisive

    def junction(p):
        lv = fa(p)
        if lv is decisive:
            return decisive
        rv = fb(p)
        if rv is decisive:
            return decisive
        if lv is None or rv is None:
            return None
        return other
    return _Node(junction, f"({a.text}) {word} ({b.text})", a.tok, is_bool=True)


def _and(a: _Node, b: _Node) -> _Node:
    return _junction(a, b, False, "AND")


def _or(a: _Node, b: _Node) -> _Node:
    return _junction(a, b, True, "OR")


def _is_null(n: _Node) -> _Node:
    f = n.get or n.fn
    return _Node(lambda p: f(p) is None, f"{n.text} IS NULL", n.tok, is_bool=True)


def _equal(a: _Node, b: _Node, op: _Token) -> _Node:
    text = f"{a.text} = {b.text}"
    if a.prop is not None and b.is_const and type(b.const) is str and "\ufffd" not in b.const:
        # the common case: property = 'text' (Java: equals, else compareTo == 0: the same),
        # compared as UTF-8 bytes (a literal with U+FFFD may equal a broken sequence decoded)
        get, c = a.get, b.const.encode()

        def eq_prop_str(p):
            v = get(p)
            if v is None:
                return None
            return v == c
        return _Node(eq_prop_str, text, op, is_bool=True)
    fa, fb = a.fn, b.fn

    def eq(p):
        lv = fa(p)
        rv = fb(p)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return _jcompare(lv, rv) == 0
    return _Node(eq, text, op, is_bool=True)


_ORDER_TESTS = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}
_ORDER_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def _ordered(a: _Node, sym: str, b: _Node, op_tok: _Token) -> _Node:
    text = f"{a.text} {sym} {b.text}"
    test = _ORDER_TESTS[sym]
    if a.prop is not None and b.is_const:
        # the common case: property OP number; the property text is converted to the
        # literal's type (Integer.valueOf / Long.valueOf / Double.valueOf)
        get, c, op = a.get, b.const, _ORDER_OPS[sym]
        if type(c) is float:
            def ord_prop_double(p):
                v = get(p)
                if v is None:
                    return None
                x = _parse_double_b(v)
                # NaN (and signed zeros) need Double.compare; the literal is never NaN or 0
                return op(x, c) if x == x else test(_dcmp(x, c))
            return _Node(ord_prop_double, text, op_tok, is_bool=True)
        conv = _parse_int_b if type(c) is int else _parse_long_b

        def ord_prop_int(p):
            v = get(p)
            if v is None:
                return None
            return op(conv(v), c)
        return _Node(ord_prop_int, text, op_tok, is_bool=True)
    fa, fb = a.fn, b.fn

    def ordered(p):
        lv = fa(p)
        if lv is None:
            return None
        rv = fb(p)
        if rv is None:
            return None
        return test(_order(lv, rv))
    return _Node(ordered, text, op_tok, is_bool=True)


def _between(value: _Node, low: _Node, high: _Node, negate: bool, both: _Node) -> _Node:
    """`both` is Java's form (two comparisons joined by AND / OR). For a property between
    two numeric literals of one type, the same result from one lookup and one conversion
    (both comparisons would convert the same text the same way)."""
    if not (value.prop is not None and low.is_const and high.is_const
            and type(low.const) is type(high.const) and type(low.const) in (int, JLong)):
        return both
    get, lo, hi = value.get, low.const, high.const
    conv = _parse_int_b if type(lo) is int else _parse_long_b
    if negate:
        def not_between(p):
            v = get(p)
            if v is None:
                return None
            x = conv(v)
            return x < lo or x > hi
        return _Node(not_between, both.text, both.tok, is_bool=True)

    def between(p):
        v = get(p)
        if v is None:
            return None
        return lo <= conv(v) <= hi
    return _Node(between, both.text, both.tok, is_bool=True)


def _in(n: _Node, items: list[str], negate: bool, op: _Token) -> _Node:
    name = n.prop
    shown = ", ".join(_java_text(s) for s in items)
    if any("\ufffd" in s for s in items):
        get, members = n.fn, frozenset(items)       # compare decoded text (see _equal)
    else:
        get, members = n.get, frozenset(s.encode() for s in items)

    def in_(p):
        v = get(p)
        if v is None:
            return None
        return (v in members) is not negate
    return _Node(in_, f"{name} {'NOT IN' if negate else 'IN'} ({shown})", op, is_bool=True)


def _negate_node(n: _Node, op: _Token) -> _Node:
    if n.is_const:
        v = _negate(n.const)        # still not a ConstantExpression for the grammar's checks
        return _Node(lambda p: v, f"-{n.text}", op)
    f = n.fn

    def neg(p):
        v = f(p)
        return None if v is None else _negate(v)
    return _Node(neg, f"-{n.text}", op)


# --------------------------------------------------------------------------- public API

class Expression:
    """A compiled SQL92 filter. `evaluate` gives Java's three-valued result (True, False
    or None for unknown); `matches` is what a pull uses: True only when TRUE (an
    evaluation Java would abort, such as a property that does not convert to a
    compared number, is not matched).

    `match_record(buf, pos)` is the store's per-record filter (the reference);
    `match_records(buf, starts, sizes)` the same for many records of one consume queue at
    once (also reachable as ``match_record.match_many``, which the store looks for). The
    result depends only on the values of the properties the expression names (`names`),
    so match_records reads those values for all records in a few passes
    (protocol.message's properties_at_many, then property_slots when the texts share one
    layout, else property_keys) and looks each record's values up in a table of results
    computed once per distinct combination, by the same evaluator on a properties text
    holding just those values."""

    __slots__ = ("_fn", "_memos", "_names_b", "match_record", "names", "text")

    def __init__(self, text: str, fn: Fn, names: tuple[str, ...] = ()):
        self.text = text
        self._fn = fn
        self.names = names
        self._names_b = tuple(n.encode() + b"\x01" for n in names)
        # results tables: by property_keys' values (False) and property_slots' keys (True),
        # kept apart since a value and a slot key may be the same bytes for different texts
        self._memos: dict[bool, dict] = {False: {}, True: {}}

        def match_record(buf, pos: int, _props_at=properties_at) -> bool:
            """The store's record filter: the record at buf[pos:] matches."""
            try:
                return fn(_props_at(buf, pos)) is True
            except _EvalError:
                return False
        match_record.match_many = self.match_records
        self.match_record = match_record

    def _match_props(self, props: bytes) -> bool:
        try:
            return self._fn(props) is True
        except _EvalError:
            return False

    def match_records(self, buf, starts, sizes, base: int = 0) -> list[bool]:
        """[match_record(buf, p - base) for p in starts], for whole records of one topic at
        `starts` whose TOTALSIZEs are `sizes` (what a consume queue's units give)."""
        n = len(starts)
        if not n:
            return []
        if not self.names:
            return [self._match_props(b"")] * n
        props = properties_at_many(buf, starts, sizes, base)
        # several names: one split of all texts (property_slots) instead of a regex pass a
        # name; for one name that pass is as fast as the split, and property_keys has it
        keys = property_slots(props, self.names) if len(self.names) > 1 else None
        if keys is not None:
            found = self._match_keys(props, keys, True)
            if found is not None:
                return found
        return self._match_keys(props, property_keys(props, self.names), False)

    def _match_keys(self, props, keys, slots: bool) -> list[bool] | None:
        """Results for texts `props` whose keys are `keys` (property_slots' when `slots`,
        else property_keys'), looked up in that kind's table and computed for new ones;
        None when a slots key turns out not to hold the names (the texts do not share a
        layout after all: read them by name)."""
        memo = self._memos[slots]
        found = list(map(memo.get, keys))
        if None not in found:
            return found
        missing = set(compress(keys, map(is_, found, repeat(None))))
        names = self.names
        if slots and not all(slot_names_ok(k, names) for k in missing):
            return None
        if len(missing) * 2 > len(keys):
            # mostly new combinations (a property with a value per message): no table
            match = self._match_props
            return [match(p) for p in props]
        if len(memo) + len(missing) > _MEMO_MAX:
            # a new table, not clear(): a reader may hold the old one
            self._memos = {**self._memos, slots: {}}
            memo = self._memos[slots]
            missing = set(keys)
        match = self._match_props
        fresh = {}
        if slots:
            # a key is a properties text of the names (a tuple of them joined)
            if len(names) == 1:
                for k in missing:
                    fresh[k] = match(k)
            else:
                for ks in missing:
                    fresh[ks] = match(b"\x02".join(ks))
        else:
            names_b = self._names_b
            if len(names_b) == 1:
                name_b = names_b[0]
                for v in missing:
                    fresh[v] = match(name_b + v if v else b"")
            else:
                for vs in missing:
                    fresh[vs] = match(b"\x02".join([nb + v for nb, v in zip(names_b, vs) if v]))
        # only short keys are remembered: the table's bytes stay bounded (long values, an
        # order id or a blob, are judged again next time)
        if len(names) == 1:
            short = [k for k in fresh if len(k) <= _MEMO_KEY_MAX]
        else:
            short = [ks for ks in fresh if sum(map(len, ks)) <= _MEMO_KEY_MAX]
        for k in short:
            memo[k] = fresh[k]
        return [f if f is not None else fresh[k] for f, k in zip(found, keys)]

    def evaluate(self, properties: Mapping[str, str] | str | bytes):
        """`properties`: a mapping, or the stored form (name\\x01value\\x02..., text or UTF-8)."""
        try:
            return self._fn(_stored(properties))
        except _EvalError:
            return False

    def matches(self, properties: Mapping[str, str] | str | bytes) -> bool:
        try:
            return self._fn(_stored(properties)) is True
        except _EvalError:
            return False

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


# distinct property-value combinations remembered per expression and kind of key (results of
# match_records), each key at most _MEMO_KEY_MAX bytes: ~150 KB a table, two tables an
# expression at most (and the expression cache holds at most 1,024 expressions)
_MEMO_MAX = 1024
_MEMO_KEY_MAX = 64


def _stored(properties) -> bytes:
    t = type(properties)
    if t is bytes:
        return properties
    if t is str:
        return properties.encode()
    return encode_properties(dict(properties)).encode()


def compile_expression(text: str) -> Expression:
    """Parse and compile; ParseError (with line and column) when `text` is not valid."""
    if text is None or not text.strip():
        raise ParseError("the expression is empty", 1, 1)
    parser = _Parser(text)
    return Expression(text, parser.parse().fn, tuple(parser.names))


class ExpressionCache:
    """text -> compiled Expression (or the ParseError it raised), the least recently
    used dropped beyond `max_entries`: a subscription compiles once, however many pulls
    and heartbeats carry it (Java keeps such a cache in SelectorParser too)."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Expression | ParseError] = OrderedDict()

    def __call__(self, text: str) -> Expression:
        entries = self._entries
        e = entries.get(text)
        if e is None:
            try:
                e = compile_expression(text)
            except ParseError as err:
                e = err
            entries[text] = e
            if len(entries) > self.max_entries:
                entries.popitem(last=False)
        else:
            entries.move_to_end(text)
        if type(e) is ParseError:
            raise e
        return e

    def __len__(self) -> int:
        return len(self._entries)


compiled = ExpressionCache()
