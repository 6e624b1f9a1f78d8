"""RocketMQ 4.x plain ACL: the accounts of plain_acl.yml and the decision on each request.

PURE module: no I/O, no clock. Here in common, not broker/core, because both daemons decide
with it (the nameserver protects its writes: siblings may not import each other). The shell
(remoting/acl.py) reads the files, watches their mtimes and calls `check` before every
request. The request signature itself is protocol/acl.py's.

| piece | Java 4.9.8 | here |
|---|---|---|
| file model | PlainPermissionManager.load, PlainAccessConfig | `parse_acl_file`, `build_table` |
| permission strings | Permission.parsePermFromString | `parse_perm` (unknown = DENY) |
| address patterns | RemoteAddressStrategyFactory | `parse_address_pattern` |
| resources per code | PlainAccessValidator.parse | `request_resources` (stricter, see below) |
| the decision | PlainPermissionManager.validate + checkPerm | `check` (`checker`: the same, hot codes kept) |
| gRPC: resources, decision | 5.1 PlainAccessResource.parse(GeneratedMessageV3) | `grpc_resources`, `check_grpc` |

The decision order is Java's exactly: a global white address allows; no AccessKey, an
unknown key deny; the account's white address allows (skipping signature and permissions);
a bad signature denies; a PUB on RMQ_SYS_TRACE_TOPIC allows; then admin codes need
`admin: true`, an admin account without per-resource permissions may do anything, and each
resource needs its explicit permission or the account's default. A deny carries Java's
message and the stack frame Java's reply names, so clients and consoles matching
"AclException: ..." see what they see with RocketMQ.

Stricter than 4.9.8, on purpose (4.9.8's holes): SEND_BATCH_MESSAGE needs PUB on its topic
(4.9.8 checks only the signature), and the ACL admin codes 50-54 (which hand out and read
secret keys), offset resets and consume-queue cleaning need `admin: true`.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache

from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX, TRACE_TOPIC
from pocketmq.protocol import acl as signing
from pocketmq.protocol.bodies import parse_heartbeat
from pocketmq.protocol.codes import RequestCode as R

__all__ = ["DENY", "ANY", "PUB", "SUB", "BROKER_ADMIN_CODES", "NAMESRV_PROTECTED_CODES", "AclConfigError",
           "AddressPattern", "Account", "AclFile", "AclTable", "Denial", "parse_perm", "perm_text",
           "parse_address_pattern", "parse_acl_file", "build_table", "request_resources", "check", "checker",
           "java_hash_order", "grpc_resources", "check_grpc", "account_config", "updated_account_yaml",
           "deleted_account_yaml", "updated_global_white_yaml", "KEY_MIN_LENGTH"]

# Permission bits (acl/common/Permission.java)
DENY, ANY, PUB, SUB = 1, 2, 4, 8

# accessKey and secretKey must be LONGER than this (AclConstants.ACCESS_KEY_MIN_LENGTH)
KEY_MIN_LENGTH = 6

# Java's Permission.ADMIN_CODE (17, 25, 215, 200, 207) plus what 4.9.8 leaves open to any
# signed account: the ACL codes (50 hands out accounts, 54 reads every secret key), offset
# resets and clones (they move every consumer of a group), consume-queue cleaning, and
# GET_BROKER_CONFIG (its answer holds the broker's own secretKey).
BROKER_ADMIN_CODES = frozenset({
    int(R.GET_BROKER_CONFIG),
    int(R.UPDATE_AND_CREATE_TOPIC), int(R.UPDATE_BROKER_CONFIG), int(R.DELETE_TOPIC_IN_BROKER),
    int(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP), int(R.DELETE_SUBSCRIPTIONGROUP),
    int(R.INVOKE_BROKER_TO_RESET_OFFSET), int(R.CLONE_GROUP_OFFSET), int(R.CLEAN_EXPIRED_CONSUMEQUEUE),
    int(R.UPDATE_AND_CREATE_ACL_CONFIG), int(R.DELETE_ACL_CONFIG), int(R.GET_BROKER_CLUSTER_ACL_INFO),
    int(R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG), int(R.GET_BROKER_CLUSTER_ACL_CONFIG),
})

# The nameserver (4.x has no ACL there): the writes that change routes or KV config, each
# needing an admin account's signature; reads stay open.
NAMESRV_PROTECTED_CODES = frozenset({
    int(R.REGISTER_BROKER), int(R.UNREGISTER_BROKER), int(R.PUT_KV_CONFIG), int(R.DELETE_KV_CONFIG),
    int(R.UPDATE_NAMESRV_CONFIG), int(R.DELETE_TOPIC_IN_NAMESRV), int(R.WIPE_WRITE_PERM_OF_BROKER),
    int(R.ADD_WRITE_PERM_OF_BROKER),
})

_PERMS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}


def parse_perm(text) -> int:
    """Permission.parsePermFromString: trimmed, case-sensitive; missing or unknown = DENY."""
    if not isinstance(text, str):
        return DENY
    return _PERMS.get(text.strip(), DENY)


def perm_text(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    return {PUB: "PUB", SUB: "SUB", PUB | SUB: "PUB|SUB"}.get(perm & (PUB | SUB), "DENY")


def _allowed(needed: int, owned: int) -> bool:
    # Permission.checkPermission
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


class AclConfigError(ValueError):
    """An ACL file that cannot be used; the message names the file and line."""


# --- addresses -------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _ip(text: str) -> tuple[int, int] | None:
    """(version, integer) of an address literal; an IPv4-mapped IPv6 address is its IPv4."""
    try:
        addr = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.version, int(addr)


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One whiteRemoteAddress / globalWhiteRemoteAddresses entry, compiled.

    kind: "none" (blank: matches nothing), "all", "set" (exact addresses), "range" (the
    `head` parts fixed, part number `index` within lo..hi, the rest anything)."""
    text: str
    kind: str
    addresses: frozenset = frozenset()
    version: int = 4
    head: tuple = ()
    index: int = 0
    lo: int = 0
    hi: int = 0

    def match(self, ip: str | None) -> bool:
        kind = self.kind
        if kind == "all":
            return True
        if kind == "none" or not ip:
            return False
        addr = _ip(ip)
        if addr is None:
            return False
        if kind == "set":
            return addr in self.addresses
        version, value = addr
        if version != self.version:
            return False
        bits, count = (8, 4) if version == 4 else (16, 8)
        mask = (1 << bits) - 1
        parts = [(value >> (bits * (count - 1 - i))) & mask for i in range(count)]
        return tuple(parts[:self.index]) == self.head and self.lo <= parts[self.index] <= self.hi


_BLANK = AddressPattern("", "none")
_ALL = AddressPattern("*", "all")


def _exact(text: str) -> tuple[int, int]:
    addr = _ip(text)
    if addr is None or not text.strip():
        raise ValueError(f"Netaddress examine Exception netaddress is {text}")
    return addr


def parse_address_pattern(text) -> AddressPattern:
    """RemoteAddressStrategyFactory's forms: blank (nothing), `*` / `*.*.*.*` /
    `*:*:*:*:*:*:*:*` (everything), `a.b.c.{1,2}` and `a:b::{1,2}`, comma lists of
    addresses, `a.b.*` / `a.b.1-100` / `a.b.1-100.*` (and IPv6 `a:b::c:*`, `a:b::c:1-ff`),
    and one address. Raises ValueError with Java's message for anything else. Parts after
    a `*` or a range must be `*` (Java ignores them: `10.*.1.2` lets all of 10/8 in)."""
    if text is None:
        return _BLANK
    text = str(text).strip()
    if not text:
        return _BLANK
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _ALL
    if text.endswith("}"):
        brace = text.find("{")
        if brace < 0 or "{" in text[brace + 1:]:
            raise ValueError(f"MultipleRemoteAddressStrategy netaddress examine scope Exception netaddress {text}")
        prefix = text[:brace]
        items = [s for s in text[brace + 1:-1].split(",") if s.strip()]
        return AddressPattern(text, "set", frozenset(_exact(prefix + s.strip()) for s in items))
    if "," in text:
        return AddressPattern(text, "set", frozenset(_exact(s) for s in text.split(",") if s.strip()))
    if "*" in text or "-" in text:
        return _range_pattern(text)
    return AddressPattern(text, "set", frozenset({_exact(text)}))


def _range_pattern(text: str) -> AddressPattern:
    bad = ValueError(f"Netaddress examine scope Exception netaddress is {text}")
    v6 = ":" in text
    sep, count, top, base = (":", 8, 0xFFFF, 16) if v6 else (".", 4, 255, 10)
    parts = [p.strip() for p in text.split(sep)]
    k = next((i for i, p in enumerate(parts) if p == "*" or "-" in p), -1)
    if k <= 0 or any(p != "*" for p in parts[k + 1:]):
        raise bad
    tail = len(parts) - k          # the wildcard part and those after it
    if v6:
        head_text = sep.join(parts[:k])
        head_count = count - tail if "::" in head_text or len(parts) == count else k
        if "::" in head_text:
            left, _, right = head_text.partition("::")
            lp = [p for p in left.split(":") if p]
            rp = [p for p in right.split(":") if p]
            fill = head_count - len(lp) - len(rp)
            if fill < 0:
                raise bad
            head_parts = lp + ["0"] * fill + rp
        else:
            head_parts = parts[:k]
    else:
        head_parts = parts[:k]
    if len(head_parts) >= count:
        raise bad
    try:
        head = tuple(int(p, base) for p in head_parts)
        if parts[k] == "*":
            lo, hi = 0, top
        else:
            a, _, b = parts[k].partition("-")
            if not a or not b:
                raise bad
            lo, hi = int(a, base), int(b, base)
    except ValueError:
        raise bad from None
    if any(not 0 <= h <= top for h in head) or not (0 <= lo <= hi <= top):
        raise ValueError(f"RangeRemoteAddressStrategy netaddress examine scope Exception start is {lo} , "
                         f"end is {hi}")
    return AddressPattern(text, "range", version=6 if v6 else 4, head=head, index=len(head), lo=lo, hi=hi)


# --- the files -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    # resource -> perm; groups stored as %RETRY%<group> (Java's map); None: none given
    perms: dict | None
    path: str = ""
    line: int = 0
    config: dict = field(default_factory=dict)   # the account as written (for code 54)


@dataclass(frozen=True, slots=True)
class AclFile:
    path: str
    global_white: tuple = ()            # AddressPattern
    global_white_text: tuple = ()       # as written
    accounts: tuple = ()                # Account, in file order
    version: tuple = (0, 0)             # dataVersion (timestamp, counter)
    has_data: bool = True               # False: empty, comments only, null or {} (Java: "No data")


def _text(value) -> str | None:
    """A YAML scalar as Java's JSON conversion makes it a String (12345678 -> "12345678")."""
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise TypeError("expected a single value, got a " + ("map" if isinstance(value, dict) else "list"))
    return signing.field_text(value)


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise TypeError(f"expected true or false, got {value!r}")


def _str_list(value, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        # a single string where a list belongs: Java's JSON conversion fails; one item is kinder
        value = [value]
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list")
    return [_text(v) for v in value if v is not None]


def _resource_perms(perms: dict, items: list[str] | None, is_topic: bool) -> None:
    # Permission.parseResourcePerms: "name=PERM" (StringUtils.split drops empty tokens)
    for item in items or ():
        tokens = [t for t in item.split("=") if t]
        if len(tokens) != 2:
            raise ValueError(f"Parse resource permission failed for {'topic' if is_topic else 'group'}:{item}")
        name = tokens[0].strip()
        perms[name if is_topic else RETRY_GROUP_TOPIC_PREFIX + name] = parse_perm(tokens[1])


def _mask(secret) -> str:
    # the load error goes to the log: the secret itself never does (Java prints it)
    return "null" if secret is None else f"<{len(secret)} characters>"


def build_account(raw: dict, path: str = "", line: int = 0) -> Account:
    """PlainPermissionManager.buildPlainAccessResource. Raises ValueError/TypeError."""
    ak, sk = _text(raw.get("accessKey")), _text(raw.get("secretKey"))
    if ak is None or sk is None or len(ak) <= KEY_MIN_LENGTH or len(sk) <= KEY_MIN_LENGTH:
        raise ValueError(f"The accessKey={ak} and secretKey={_mask(sk)} cannot be null and length should "
                         f"longer than 6")
    perms: dict = {}
    _resource_perms(perms, _str_list(raw.get("groupPerms"), "groupPerms"), False)
    _resource_perms(perms, _str_list(raw.get("topicPerms"), "topicPerms"), True)
    has_perms = raw.get("groupPerms") or raw.get("topicPerms")
    return Account(access_key=ak, secret_key=sk, white=parse_address_pattern(_text(raw.get("whiteRemoteAddress"))),
                   admin=_bool(raw.get("admin")), default_topic_perm=parse_perm(_text(raw.get("defaultTopicPerm"))),
                   default_group_perm=parse_perm(_text(raw.get("defaultGroupPerm"))),
                   perms=perms if has_perms else None, path=path, line=line, config=dict(raw))


def _yaml():
    # PyYAML's safe loader: plain data only (no tags that build objects), as Java's
    # loader allows only PlainAccessConfig. Imported here: only ACL users pay for it.
    import yaml
    return yaml


# A real plain_acl.yml is a few KB (thousands of accounts stay far below this); YAML is
# parsed at ~1 MB/s even by libyaml once Python builds the objects, so the bound also bounds
# a reload's time (the shell parses in a worker thread, never on the event loop).
MAX_FILE_BYTES = 1 << 20


def load_yaml(text: str | bytes, path: str):
    """(data, node) of one YAML document; AclConfigError naming path:line otherwise."""
    yaml = _yaml()
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_FILE_BYTES:
            raise AclConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise AclConfigError(f"{path}: not UTF-8 at byte {e.start}") from None
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)    # libyaml when built with it
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        # (libyaml places a problem found at the end of the text one line past it)
        lines = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        where = f"{path}:{min(mark.line + 1, lines)}" if mark is not None else path
        context = f" ({e.context} at line {e.context_mark.line + 1})" if e.context and e.context_mark else ""
        raise AclConfigError(f"{where}: {e.problem or 'not YAML'}{context}") from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as e:
        raise AclConfigError(f"{path}: not YAML: {type(e).__name__}: {e}") from None
    return data, node


def _account_lines(node) -> list[int]:
    """1-based line of each item of the top-level `accounts` sequence."""
    yaml = _yaml()
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "accounts" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def parse_acl_file(text: str | bytes, path: str) -> AclFile:
    """One plain_acl.yml. An empty file (or only comments, null, {}) is an empty AclFile with
    has_data False. Raises AclConfigError naming the file and line (a key shorter than 7
    characters, a bad pattern or resource permission, a shape Java's loader would refuse)."""
    data, node = load_yaml(text, path)
    if data is None or data == {}:
        return AclFile(path, has_data=False)
    if not isinstance(data, dict):
        raise AclConfigError(f"{path}:1: expected a map with globalWhiteRemoteAddresses and accounts")
    lines = _account_lines(node)
    try:
        white_text = tuple(s for s in (_str_list(data.get("globalWhiteRemoteAddresses"),
                                                 "globalWhiteRemoteAddresses") or ()) if s is not None)
        white = tuple(parse_address_pattern(s) for s in white_text)
    except (ValueError, TypeError) as e:
        raise AclConfigError(f"{path}: globalWhiteRemoteAddresses: {e}") from None
    raw_accounts = data.get("accounts")
    if raw_accounts is None:
        raw_accounts = []
    if not isinstance(raw_accounts, list):
        raise AclConfigError(f"{path}: accounts must be a list")
    accounts = []
    for i, raw in enumerate(raw_accounts):
        line = lines[i] if i < len(lines) else 0
        if not isinstance(raw, dict):
            raise AclConfigError(f"{path}:{line}: an account must be a map (accessKey, secretKey, ...)")
        try:
            accounts.append(build_account(raw, path, line))
        except (ValueError, TypeError) as e:
            raise AclConfigError(f"{path}:{line}: {e}") from None
    version = (0, 0)
    dv = data.get("dataVersion")
    if isinstance(dv, list) and dv and isinstance(dv[0], dict):
        try:
            version = (int(dv[0].get("timestamp") or 0), int(dv[0].get("counter") or 0))
        except (TypeError, ValueError):
            pass
    return AclFile(path, white, white_text, tuple(accounts), version)


@dataclass(frozen=True, slots=True)
class AclTable:
    files: tuple = ()                   # AclFile, in load order
    global_white: tuple = ()            # every file's patterns
    accounts: dict = field(default_factory=dict)   # accessKey -> Account (first definition wins)
    duplicates: tuple = ()              # (accessKey, path) definitions ignored


def keep_files_without_data(previous: AclTable, files) -> tuple[list, list]:
    """(files, paths kept) for a reload: a file read with no data keeps its previous
    definitions, as Java's reload of a changed file does (`load(path)`: "No data in {}, skip
    it"). An editor's or a script's truncate-then-write read between the two is such a file:
    without this, every account it defines would be refused until the next poll. A file
    not loaded before has nothing to keep (Java's full load skips it too)."""
    before = {f.path: f for f in previous.files}
    out, kept = [], []
    for f in files:
        if not f.has_data and f.path in before:
            kept.append(f.path)
            f = before[f.path]
        out.append(f)
    return out, kept


def build_table(files) -> AclTable:
    """Java's load(): global white addresses of all files; an accessKey defined twice keeps
    its first definition (the later ones are listed in `duplicates`, to be logged)."""
    accounts: dict = {}
    dups = []
    white = []
    for f in files:
        white.extend(f.global_white)
        for a in f.accounts:
            if a.access_key in accounts:
                dups.append((a.access_key, f.path))
            else:
                accounts[a.access_key] = a
    return AclTable(tuple(files), tuple(white), accounts, tuple(dups))


# --- the decision ----------------------------------------------------------------------------

_PM = "org.apache.rocketmq.acl.plain.PlainPermissionManager"
# the first stack frame Java's reply names (NettyRemotingAbstract: e.toString() + ", " + frame)
FRAME_VALIDATE = {"no_access_key": f"{_PM}.validate(PlainPermissionManager.java:664)",
                  "unknown_key": f"{_PM}.validate(PlainPermissionManager.java:668)",
                  "signature": f"{_PM}.validate(PlainPermissionManager.java:684)",
                  "admin": f"{_PM}.checkPerm(PlainPermissionManager.java:581)",
                  "default_perm": f"{_PM}.checkPerm(PlainPermissionManager.java:606)",
                  "perm": f"{_PM}.checkPerm(PlainPermissionManager.java:611)",
                  "parse": "org.apache.rocketmq.acl.plain.PlainAccessValidator.parse(PlainAccessValidator.java:134)",
                  # gRPC only (check_grpc: its answers carry the message, not this frame)
                  "header": "org.apache.rocketmq.acl.common.AuthorizationHeader.<init>"}


@dataclass(frozen=True, slots=True)
class Denial:
    reason: str          # a key of FRAME_VALIDATE: the kind of deny (metrics label)
    message: str         # Java's AclException message
    access_key: str | None = None
    resource: str | None = None

    @property
    def remark(self) -> str:
        return f"org.apache.rocketmq.acl.common.AclException: {self.message}, {FRAME_VALIDATE[self.reason]}"


def _retry(group) -> str | None:
    return None if group is None else RETRY_GROUP_TOPIC_PREFIX + group


def _add(res: dict, resource, perm: int) -> None:
    if resource is not None:
        res[resource] = perm


_CONSUME_CODES = frozenset({R.PULL_MESSAGE, R.POP_MESSAGE, R.ACK_MESSAGE, R.CHANGE_MESSAGE_INVISIBLETIME})


# the codes every request is tested against, as plain ints (an enum member lookup costs
# ~50 ns, and the broker checks every request)
_SEND_V2, _SEND_BATCH, _HEART_BEAT = int(R.SEND_MESSAGE_V2), int(R.SEND_BATCH_MESSAGE), int(R.HEART_BEAT)


def request_resources(code: int, ext: dict, body) -> dict:
    """PlainAccessValidator.parse's resources (insertion-ordered): resource -> needed perm.
    Raises ValueError for a heartbeat body that does not decode (Java: AclException from
    parse)."""
    res: dict = {}
    if code == _SEND_V2 or code == _SEND_BATCH and "b" in ext:
        # (a batch goes with the V2 header's one-letter keys; V1's names are read too)
        topic = ext.get("b")
        if topic is not None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            _add(res, _retry(ext.get("a")), SUB)
        else:
            _add(res, topic, PUB)
    elif code == R.SEND_MESSAGE or code == R.SEND_BATCH_MESSAGE:
        topic = ext.get("topic")
        if topic is not None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            _add(res, _retry(ext.get("group")), SUB)
        else:
            _add(res, topic, PUB)
    elif code in _CONSUME_CODES:
        # (RocketMQ 5's POP codes carry the same two names as a pull: the topic and the group)
        _add(res, ext.get("topic"), SUB)
        _add(res, _retry(ext.get("consumerGroup")), SUB)
    elif code == R.CONSUMER_SEND_MSG_BACK:
        _add(res, _retry(ext.get("group")), SUB)
    elif code == R.QUERY_MESSAGE:
        _add(res, ext.get("topic"), SUB)
    elif code == R.HEART_BEAT:
        try:
            hb = parse_heartbeat(body if body is not None else b"")
        except Exception as e:   # whatever a hostile body raises: a deny, never a crash
            raise ValueError(str(e) or type(e).__name__) from None
        for c in hb.consumer_data_set:
            _add(res, _retry(c.group_name), SUB)
            for s in c.subscription_data_set:
                _add(res, s.topic, SUB)
    elif code == R.UNREGISTER_CLIENT or code == R.GET_CONSUMER_LIST_BY_GROUP:
        _add(res, _retry(ext.get("consumerGroup")), SUB)
    elif code == R.UPDATE_CONSUMER_OFFSET:
        _add(res, _retry(ext.get("consumerGroup")), SUB)
        _add(res, ext.get("topic"), SUB)
    return res


def _java_string_hash(s: str) -> int:
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


def java_hash_order(keys) -> list:
    """`keys` in the order a java.util.HashMap holding them iterates (buckets of the spread
    String hash, insertion order within one): which failing resource Java names first."""
    keys = list(dict.fromkeys(keys))
    cap = 16
    while len(keys) > cap * 3 // 4:
        cap *= 2

    def bucket(k: str) -> int:
        h = _java_string_hash(k)
        return (h ^ (h >> 16)) & (cap - 1)
    return sorted(keys, key=bucket)     # sorted is stable: insertion order within a bucket


def _resource_name(resource: str) -> tuple[str, bool]:
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return f"group:{resource[len(RETRY_GROUP_TOPIC_PREFIX):]}", True
    return f"topic:{resource}", False


_ALLOWED = object()     # _identify: the address is white, nothing more to check


def _identify(table: AclTable, ak: str | None, remote_ip: str | None):
    """Java's validate up to the signature: _ALLOWED (a global white address, or the
    account's own), a Denial (no accessKey, an unknown one), or the Account whose
    signature is to be checked next."""
    if table.global_white:
        for pattern in table.global_white:
            if pattern.match(remote_ip):
                return _ALLOWED
    if ak is None:
        return Denial("no_access_key", "No accessKey is configured")
    account = table.accounts.get(ak)
    if account is None:
        return Denial("unknown_key", f"No acl config for {ak}", ak)
    white = account.white
    if white.kind != "none" and white.match(remote_ip):     # (most accounts have none)
        return _ALLOWED
    return account


def _permit(account: Account, code, resources: dict, admin_codes: frozenset) -> Denial | None:
    """Java's validate after the signature, and checkPerm: the trace topic, admin codes,
    then every resource's permission (explicit, else the account's default)."""
    ak = account.access_key
    if resources.get(TRACE_TOPIC) == PUB:
        return None
    if code in admin_codes and not account.admin:
        return Denial("admin", f"Need admin permission for request code={code}, but accessKey={ak} is not", ak)
    if not resources or (account.perms is None and account.admin):
        return None
    owned = account.perms
    failing = []
    for resource, needed in resources.items():
        explicit = owned is not None and resource in owned
        if explicit:
            perm = owned[resource]
        else:
            perm = account.default_group_perm if resource.startswith(RETRY_GROUP_TOPIC_PREFIX) \
                else account.default_topic_perm
        if not _allowed(needed, perm):
            failing.append((resource, explicit))
    if not failing:
        return None
    first = failing[0] if len(failing) == 1 else min(
        failing, key=lambda f, order=java_hash_order(resources): order.index(f[0]))
    resource, explicit = first
    name, _ = _resource_name(resource)
    return Denial("perm" if explicit else "default_perm", f"No default permission for {name}", ak, name)


def check(table: AclTable, code: int, ext: dict | None, body, remote_ip: str | None,
          admin_codes: frozenset = BROKER_ADMIN_CODES) -> Denial | None:
    """None to allow the request, or the Denial Java 4.9 would answer (its order, its texts).
    `remote_ip`: the peer's address without the port. Never raises."""
    ext = ext or {}
    resources = None
    if code == _HEART_BEAT and ext:
        # Java parses the body before anything else: one that does not decode is refused
        # even from a white address (the other codes' resources cannot fail)
        try:
            resources = request_resources(code, ext, body)
        except ValueError as e:
            return Denial("parse", str(e), ext.get(signing.ACCESS_KEY))
    who = _identify(table, ext.get(signing.ACCESS_KEY), remote_ip)
    if who is _ALLOWED:
        return None
    if isinstance(who, Denial):
        return who
    if not signing.signature_matches(ext, body, who.secret_key):
        return _bad_signature(who)
    if resources is None:
        resources = request_resources(code, ext, body)
    return _permit(who, code, resources, admin_codes)


def _bad_signature(account: Account) -> Denial:
    return Denial("signature", f"Check signature failed for accessKey={account.access_key}", account.access_key)


# The hot codes' decisions kept per (accessKey, code, the names the resources come from):
# `checker` below. A request's resources for these codes are a function of those names
# alone, and the decision of the resources, the account and the admin codes, all fixed for
# one table. Bounded: emptied when it reaches _DECIDED_MAX.
_DECIDED_MAX = 4096
_PULL = int(R.PULL_MESSAGE)
_SEND_V1 = int(R.SEND_MESSAGE)


def _send_key(ak, code: int, topic, ext: dict, group_field: str) -> tuple:
    # (request_resources: the group counts only for a %RETRY% topic)
    retry = type(topic) is str and topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
    return ak, code, topic, ext.get(group_field) if retry else None


# A kept key's names are at most this long (RocketMQ's limits: 127 for a topic, 255 for a
# group; a longer one is refused by the processor after the check): the table stays small
# whatever names an allowed account sends.
_KEY_NAME_MAX = 255


def _keepable(key: tuple) -> bool:
    ak, _, a, b = key
    return (type(ak) is str and len(ak) <= _KEY_NAME_MAX
            and (a is None or type(a) is str and len(a) <= _KEY_NAME_MAX)
            and (b is None or type(b) is str and len(b) <= _KEY_NAME_MAX))


def checker(table: AclTable, admin_codes: frozenset = BROKER_ADMIN_CODES):
    """`check` for one table, as a function (code, ext, body, remote_ip) -> Denial | None,
    with the same answers (pinned to `check` by tests/unit/test_acl_rules.py).

    Why: the broker checks every request, and in a running broker the plain rule's calls
    (identify, resources, permissions) cost ~2 us a send beside the signature. For the
    codes of the hot paths (SEND_MESSAGE_V2/V1, SEND_BATCH_MESSAGE, PULL_MESSAGE) from an
    account without a white address, under no global white address, a decision once
    allowed is kept: such a request is its account, its signature and a dict lookup. Every
    other request, and any first one, takes `check`. The kept keys are bounded in number
    (_DECIDED_MAX) and in size (names of at most _KEY_NAME_MAX characters; a send's group
    only where the decision reads it)."""
    if table.global_white:
        # (a global white address allows before anything else: nothing to keep)
        return lambda code, ext, body, ip: check(table, code, ext, body, ip, admin_codes)
    accounts = {ak: a for ak, a in table.accounts.items() if a.white.kind == "none"}
    decided: dict = {}
    access_key = signing.ACCESS_KEY
    matches = signing.signature_matches

    def fast(code, ext, body, ip):
        key = None
        if ext:
            # the key holds what the decision reads and nothing more: a send's group only
            # for a %RETRY% topic (a new group per request must not make a new entry)
            if code == _SEND_V2 or code == _SEND_BATCH and "b" in ext:
                key = _send_key(ext.get(access_key), code, ext.get("b"), ext, "a")
            elif code == _PULL:
                key = (ext.get(access_key), code, ext.get("topic"), ext.get("consumerGroup"))
            elif code == _SEND_V1 or code == _SEND_BATCH:
                key = _send_key(ext.get(access_key), code, ext.get("topic"), ext, "group")
            if key is not None:
                try:
                    account = decided.get(key)
                except TypeError:         # a hostile frame's unhashable value
                    key = account = None
                if account is not None:
                    return None if matches(ext, body, account.secret_key) else _bad_signature(account)
        denial = check(table, code, ext, body, ip, admin_codes)
        if denial is None and key is not None and _keepable(key):
            account = accounts.get(key[0])
            if account is not None:
                if len(decided) >= _DECIDED_MAX:
                    decided.clear()
                decided[key] = account
        return denial
    fast.decided = decided       # (what is kept: for tests and inspection)
    return fast


# --- RocketMQ 5's gRPC endpoint ---------------------------------------------------------------
#
# Java 5.1's proxy checks every gRPC request message (each Telemetry command too) against
# the same plain-ACL accounts (PlainAccessResource.parse(GeneratedMessageV3, header), then
# PlainPermissionManager.validate): the accessKey and signature come from the
# `authorization` header (broker/proxy/auth.py parses and verifies it), the resources from
# the request message, below. The request is a protobuf message of apache.rocketmq.v2
# read by its field names (this layer does not import the generated modules).

# ClientType values that consume (PUSH, SIMPLE, PULL, LITE_PUSH, LITE_SIMPLE)
_CONSUMER_TYPES = frozenset({2, 3, 4, 5, 6})


def _name(resource) -> str:
    # a Resource; its namespace is not used (pocketmq topics and groups have none)
    return resource.name


def grpc_resources(rpc: str, request) -> dict:
    """The resources a MessagingService request needs (resource -> perm; groups as
    %RETRY%<group>), as Java 5.1's PlainAccessResource.parse builds them: SendMessage,
    EndTransaction, RecallMessage PUB on the topic; ReceiveMessage, AckMessage,
    ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, QueryAssignment (and the
    offset RPCs, PullMessage, SyncLiteSubscription) SUB on the group and the topic;
    QueryRoute any permission on the topic; a consumer's Heartbeat SUB on its group; a
    Telemetry settings command PUB on each topic it publishes, or SUB on its group and each
    topic it subscribes; NotifyClientTermination SUB on its group. `request` None (a
    Telemetry stream's start): nothing but the signature.

    Differences, on purpose: every topic of a SendMessage needs PUB (Java refuses mixed
    topics outright; the service refuses them too), and a NotifyClientTermination without a
    group (a producer's) names no group (Java checks the group "" against the default).
    Raises ValueError where Java throws AclException (a consumer heartbeat without group, a
    settings command with neither publishing nor subscription)."""
    res: dict = {}
    if request is None:
        return res
    if rpc == "SendMessage":
        for m in request.messages:
            res[_name(m.topic)] = PUB
    elif rpc in ("ReceiveMessage", "PullMessage", "UpdateOffset", "GetOffset"):
        res[_retry(_name(request.group))] = SUB
        res[_name(request.message_queue.topic)] = SUB
    elif rpc in ("AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue", "QueryAssignment",
                 "SyncLiteSubscription"):
        res[_retry(_name(request.group))] = SUB
        res[_name(request.topic)] = SUB
    elif rpc in ("EndTransaction", "RecallMessage"):
        res[_name(request.topic)] = PUB
    elif rpc == "QueryRoute":
        res[_name(request.topic)] = ANY
    elif rpc == "QueryOffset":
        res[_name(request.message_queue.topic)] = SUB
    elif rpc == "Heartbeat":
        if request.client_type in _CONSUMER_TYPES:
            if not request.HasField("group"):
                raise ValueError("Consumer heartbeat doesn't have group")
            res[_retry(_name(request.group))] = SUB
    elif rpc == "NotifyClientTermination":
        if request.HasField("group"):
            res[_retry(_name(request.group))] = SUB
    elif rpc == "Telemetry":
        if request.WhichOneof("command") == "settings":
            settings = request.settings
            kind = settings.WhichOneof("pub_sub")
            if kind == "publishing":
                for t in settings.publishing.topics:
                    res[_name(t)] = PUB
            elif kind == "subscription":
                sub = settings.subscription
                res[_retry(_name(sub.group))] = SUB
                for entry in sub.subscriptions:
                    res[_name(entry.topic)] = SUB
            else:
                raise ValueError("settings command doesn't have publishing or subscription")
    else:
        raise ValueError(f"unknown MessagingService RPC {rpc}")
    return res


def check_grpc(table: AclTable, rpc: str, request, access_key: str | None, signed, remote_ip: str | None,
               header_error: str | None = None) -> Denial | None:
    """None to allow a gRPC request, or its Denial, in Java's order: the request's resources
    (a request Java cannot parse is refused first), a global white address allows, then
    the account as `check` finds it, the signature (`signed(secret_key)` -> bool; an
    `header_error` — the authorization header missing or malformed — refuses here, once a
    white address has had its say), then the permissions."""
    try:
        resources = grpc_resources(rpc, request)
    except ValueError as e:
        return Denial("parse", str(e), access_key)
    if header_error is not None:
        if _identify(table, None, remote_ip) is _ALLOWED:
            return None
        return Denial("header", header_error, access_key)
    who = _identify(table, access_key, remote_ip)
    if who is _ALLOWED:
        return None
    if isinstance(who, Denial):
        return who
    if not signed(who.secret_key):
        return Denial("signature", f"Check signature failed for accessKey={who.access_key}", who.access_key)
    return _permit(who, rpc, resources, frozenset())


# --- the admin codes' edits of a file (50, 51, 53) --------------------------------------------

def account_config(ext: dict) -> dict:
    """CreateAccessConfigRequestHeader (code 50) as the account map Java writes
    (createAclAccessConfigMap): topicPerms/groupPerms comma lists split."""
    def split(v):
        return None if v is None else [s for s in v.split(",") if s]
    admin = ext.get("admin")
    return {"accessKey": ext.get("accessKey"), "secretKey": ext.get("secretKey"),
            "whiteRemoteAddress": ext.get("whiteRemoteAddress"),
            "admin": str(admin).strip().lower() == "true" if admin is not None else False,
            "defaultTopicPerm": ext.get("defaultTopicPerm"), "defaultGroupPerm": ext.get("defaultGroupPerm"),
            "topicPerms": split(ext.get("topicPerms")), "groupPerms": split(ext.get("groupPerms"))}


def _check_resource_perms(items) -> None:
    # Permission.checkResourcePerms (what code 50 refuses)
    for item in items or ():
        tokens = [t for t in item.split("=") if t]
        if len(tokens) != 2:
            raise ValueError(f"Parse Resource format error for {item}.\nThe expected resource format is "
                             f"'Res=Perm'. For example: topicA=SUB")
        if tokens[1].strip() != "DENY" and parse_perm(tokens[1]) == DENY:
            raise ValueError(f"Parse resource permission error for {item}.\nThe expected permissions are "
                             f"'SUB' or 'PUB' or 'SUB|PUB' or 'PUB|SUB'.")


def _dump(data: dict, version: tuple, now_ms: int) -> str:
    ts, counter = version
    data = dict(data)
    data["dataVersion"] = [{"counter": counter + 1, "timestamp": now_ms}]
    return _yaml().safe_dump(data, default_flow_style=False, sort_keys=False, allow_unicode=True)


def _file_data(text, path: str) -> dict:
    data, _ = load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{path}:1: expected a map with globalWhiteRemoteAddresses and accounts")
    return data


def updated_account_yaml(text, path: str, config: dict, version: tuple, now_ms: int) -> str:
    """The file's text with the account of config["accessKey"] created or updated (Java's
    updateAccessConfig: given fields replace, others stay). Raises ValueError with Java's
    message for keys too short or bad resource permissions."""
    ak, sk = config.get("accessKey"), config.get("secretKey")
    if ak is None or sk is None or len(ak) <= KEY_MIN_LENGTH or len(sk) <= KEY_MIN_LENGTH:
        raise ValueError(f"The accessKey={ak} and secretKey={sk} cannot be null and length should longer than 6")
    _check_resource_perms(config.get("topicPerms"))
    _check_resource_perms(config.get("groupPerms"))
    data = _file_data(text, path)
    accounts = data.get("accounts")
    accounts = list(accounts) if isinstance(accounts, list) else []
    new = {k: v for k, v in config.items() if v is not None}
    for i, acc in enumerate(accounts):
        if isinstance(acc, dict) and _text(acc.get("accessKey")) == ak:
            merged = accounts[i] = {**acc, **new}
            break
    else:
        merged = new
        accounts.append(new)
    build_account(merged)       # what the loader would refuse is refused now, not at the reload
    data["accounts"] = accounts
    return _dump(data, version, now_ms)


def deleted_account_yaml(text, path: str, access_key: str, version: tuple, now_ms: int) -> str | None:
    """The file's text without the account; None when it holds no such account."""
    data = _file_data(text, path)
    accounts = data.get("accounts")
    if not isinstance(accounts, list):
        return None
    kept = [a for a in accounts if not (isinstance(a, dict) and _text(a.get("accessKey")) == access_key)]
    if len(kept) == len(accounts):
        return None
    data["accounts"] = kept
    return _dump(data, version, now_ms)


def updated_global_white_yaml(text, path: str, addresses: list[str], version: tuple, now_ms: int) -> str:
    """The file's text with globalWhiteRemoteAddresses replaced (each checked first)."""
    for a in addresses:
        parse_address_pattern(a)
    data = _file_data(text, path)
    data["globalWhiteRemoteAddresses"] = list(addresses)
    return _dump(data, version, now_ms)
