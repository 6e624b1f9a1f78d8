"""The plain ACL's shell, one per daemon (broker and nameserver): reads the files, reloads
them when they change, and checks each request before its processor runs (the rules:
common/acl.py).

Files (Java's PlainPermissionManager): the main file (`aclFilePath`, default plain_acl.yml
beside the daemon's -c file) and every *.yml / *.yaml under the `acl/` folder beside it,
the folder's files first (sorted), the main file last; an accessKey defined twice keeps its
first definition. A missing main file is an empty one (everything signed is refused).

Reload (Java's AclFileWatchService polls every 5 s): every `poll_interval_s` (1 s) the
files' (mtime, size, inode) are compared with the last load; any change reloads them all,
read and parsed in a worker thread (the event loop only swaps the table in).
A file that does not parse keeps the previous accounts (logged once per change, naming the
file and line); at start it refuses the start instead, as Java's broker does. A file read
with no data (empty, comments only: also a truncate-then-write caught in between) keeps
its previous definitions, as Java's reload of a changed file skips it.

Denies are answered as Java 4.9 answers them (code 1 SYSTEM_ERROR, remark "AclException:
<msg>, <frame>"; a oneway request gets nothing), logged once per (account, address, code,
resource) per `log_interval_s` with the count since, and counted by reason and code for
/metrics (`acl_metrics`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from pocketmq.common import acl as rules
from pocketmq.common.files import read_file, write_file_atomic
from pocketmq.protocol.codes import ResponseCode
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.acl")

DEFAULT_FILE_NAME = "plain_acl.yml"
ACL_DIR_NAME = "acl"
_LOG_KEYS_MAX = 10_000


def default_acl_path(config_file: str | None, configured: str | None, fallback_dir: str) -> str:
    """aclFilePath as given (a relative one is taken beside the -c file), else plain_acl.yml
    beside the -c file, else in `fallback_dir`."""
    base = os.path.dirname(os.path.abspath(config_file)) if config_file else fallback_dir
    if configured:
        path = os.path.expanduser(configured)
        return path if os.path.isabs(path) else os.path.join(base, path)
    return os.path.join(base, DEFAULT_FILE_NAME)


def acl_files(main_path: str) -> list[str]:
    """The acl/ folder's *.yml/*.yaml beside the main file (recursively, sorted), then it."""
    folder = os.path.join(os.path.dirname(main_path), ACL_DIR_NAME)
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for n in sorted(names):
            if n.endswith((".yml", ".yaml")):
                p = os.path.join(root, n)
                if os.path.abspath(p) != os.path.abspath(main_path):
                    found.append(p)
    return found + [main_path]


def _ip_of(conn) -> str:
    # the peer's address without the port, from "host:port" / "[v6]:port"
    addr = getattr(conn, "remote_addr", "") or ""
    return addr.rpartition(":")[0].strip("[]") if ":" in addr else addr


def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class AclService:
    def __init__(self, main_path: str, *, admin_codes: frozenset = rules.BROKER_ADMIN_CODES,
                 protected_codes: frozenset | None = None, poll_interval_s: float = 1.0,
                 log_interval_s: float = 60.0, name: str = "broker"):
        self.main_path = os.path.abspath(main_path)
        self.admin_codes = admin_codes
        # None: every code is checked (the broker); a set: only those (the nameserver)
        self.protected_codes = protected_codes
        self.poll_interval_s = poll_interval_s
        self.log_interval_s = log_interval_s
        self.name = name
        self.table = rules.AclTable()
        self._check = rules.checker(self.table, admin_codes)    # the table's decision (hot codes kept)
        self._stamps: dict = {}
        self._failed_stamps: dict | None = None
        self.reloads = 0
        self.reload_failures = 0
        self.last_error: str | None = None
        self.denied: dict[tuple[str, int], int] = {}
        self._logged: dict[tuple, list] = {}     # key -> [last logged monotonic s, suppressed since]
        self._task: asyncio.Task | None = None
        self.write_lock = asyncio.Lock()          # the admin codes' file edits, one at a time
        self._reload_lock = asyncio.Lock()        # poll_async's reads, one at a time

    # -- loading ---------------------------------------------------------------------------
    def _read_all(self, previous: rules.AclTable | None = None) -> tuple[rules.AclTable, dict, list]:
        paths = acl_files(self.main_path)
        stamps = {p: _stamp(p) for p in paths}
        files = []
        for p in paths:
            data = read_file(p)
            if data is None:
                continue
            files.append(rules.parse_acl_file(data, p))
        kept: list = []
        if previous is not None:
            files, kept = rules.keep_files_without_data(previous, files)
        return rules.build_table(files), stamps, kept

    def load(self) -> None:
        """The first load: raises AclConfigError (the daemon refuses to start)."""
        self._install(*self._read_all())
        if not os.path.exists(self.main_path):
            log.warning("ACL is on but %s does not exist: no account is defined, every request but from a "
                        "global white address is refused", self.main_path)

    def _install(self, table: rules.AclTable, stamps: dict, kept: list) -> None:
        for path in kept:
            log.warning("%s ACL: %s has no data; its previous accounts stay in force until it has some",
                        self.name, path)
        self.table = table
        self._check = rules.checker(table, self.admin_codes)
        self._stamps = stamps
        self._failed_stamps = None
        self.last_error = None
        for ak, path in table.duplicates:
            log.warning("The accessKey %s is repeated in multiple ACL files: %s ignored", ak, path)
        log.info("%s ACL loaded: %d account(s), %d global white address pattern(s) from %s", self.name,
                 len(table.accounts), len(table.global_white),
                 ", ".join(p for p, s in stamps.items() if s is not None) or "no file")

    def _changed(self) -> dict | None:
        """The files' stamps when they differ from the last load (and the last failure)."""
        stamps = {p: _stamp(p) for p in acl_files(self.main_path)}
        return None if stamps == self._stamps or stamps == self._failed_stamps else stamps

    def _read_or_error(self):
        try:
            return self._read_all(self.table)
        except (rules.AclConfigError, OSError) as e:
            return e

    def _apply(self, stamps: dict, result) -> bool:
        if isinstance(result, Exception):
            self.reload_failures += 1
            self._failed_stamps = stamps
            self.last_error = str(result)
            log.error("%s ACL not reloaded, the previous accounts stay in force: %s", self.name, result)
            return False
        self.reloads += 1
        self._install(*result)
        return True

    def poll(self) -> bool:
        """Reload when a file changed, appeared or went away (here, synchronously). True
        when reloaded."""
        stamps = self._changed()
        return stamps is not None and self._apply(stamps, self._read_or_error())

    async def poll_async(self) -> bool:
        """poll(), the files read and parsed in a worker thread: a large or hostile file
        never stalls the event loop (YAML parses at about 1 MB/s). One at a time (the
        watcher's and an admin edit's): a read builds on the table in force when it starts
        (files with no data keep what it holds), so a slower read finishing after a newer
        one would put older accounts back."""
        async with self._reload_lock:
            stamps = self._changed()
            if stamps is None:
                return False
            return self._apply(stamps, await asyncio.to_thread(self._read_or_error))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name=f"{self.name}-acl-watch")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.poll_async()
            except Exception:
                log.exception("ACL reload failed")

    # -- the check -------------------------------------------------------------------------
    def guard(self, table: dict) -> dict:
        """The processor table with the check before every handler (the one hook: a denied
        request never reaches its processor, so nothing of it is stored)."""
        protected = self.protected_codes
        return {code: self._guarded(proc) if protected is None or code in protected else proc
                for code, proc in table.items()}

    def _guarded(self, proc):
        deny = self.deny

        def guarded(conn, cmd):
            refusal = deny(conn, cmd)
            return proc(conn, cmd) if refusal is None else refusal
        return guarded

    def deny(self, conn, cmd):
        """None, or the reply to a denied request (a oneway one is not answered: the
        connection sends nothing for it)."""
        # (the peer's IP was taken apart once, when the connection was made)
        ip = getattr(conn, "remote_ip", None)
        if ip is None:
            ip = _ip_of(conn)
        denial = self._check(cmd.code, cmd.ext_fields, cmd.body, ip)
        if denial is None:
            return None
        self.record(denial, cmd.code, getattr(conn, "remote_addr", "") or "")
        return cmd.response(ResponseCode.SYSTEM_ERROR, denial.remark)

    def record(self, denial: rules.Denial, code, addr: str) -> None:
        """Count and log (rate-limited) one deny; `code` is the request code, or the RPC's
        name for the gRPC endpoint's (broker/proxy/auth.py)."""
        key = (denial.reason, code)
        self.denied[key] = self.denied.get(key, 0) + 1
        ip = addr.rpartition(":")[0] if ":" in addr else addr
        lkey = (denial.access_key, ip, code, denial.resource)
        now = time.monotonic()
        entry = self._logged.get(lkey)
        if entry is not None and now - entry[0] < self.log_interval_s:
            entry[1] += 1
            return
        suppressed = entry[1] if entry is not None else 0
        if entry is None and len(self._logged) >= _LOG_KEYS_MAX:
            self._logged.clear()    # bounded: a scan of many keys/addresses cannot grow it
        self._logged[lkey] = [now, 0]
        log.warning("%s ACL denied code %s from %s (accessKey %s, resource %s): %s%s", self.name, code, addr,
                    denial.access_key, denial.resource, denial.message,
                    f" (and {suppressed} more like it since the last report)" if suppressed else "")

    # -- the admin codes' writes -----------------------------------------------------------
    def file_of(self, access_key: str) -> str:
        acc = self.table.accounts.get(access_key)
        return acc.path if acc is not None and acc.path else self.main_path

    def _read_for_edit(self, path: str) -> bytes | None:
        """The file's bytes for an admin edit (in a worker thread: the check below parses
        it). A file with no data on disk whose earlier definitions are in force is refused:
        the edit of the empty text would write the edited account alone and lose the others
        (Java's edit fails on such a file too, a NullPointerException)."""
        data = read_file(path)
        if data is not None and any(f.path == path and f.has_data for f in self.table.files) \
                and not rules.parse_acl_file(data, path).has_data:
            raise rules.AclConfigError(
                f"{path} has no data on disk but its previous accounts are in force (a write "
                f"in progress or cut short?): write the file again, then edit it")
        return data

    def version_of(self, path: str) -> tuple:
        for f in self.table.files:
            if f.path == path:
                return f.version
        return (0, 0)

    async def rewrite(self, path: str, edit) -> bool:
        """Apply `edit(text, version, now_ms)` -> new text (None: nothing to change) to one
        file, written atomically, then reload. Returns False when `edit` changed nothing.
        Raises what `edit` raises (ValueError, AclConfigError) and OSError."""
        async with self.write_lock:
            data = await asyncio.to_thread(self._read_for_edit, path)
            text = edit(data or b"", self.version_of(path), int(time.time() * 1000))
            if text is None:
                return False
            await asyncio.to_thread(_write, path, text.encode("utf-8"))
            await self.poll_async()
            return True


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_file_atomic(path, data)


def acl_metrics(acl: AclService | None, labels: list[str], values: list[str]):
    """/metrics families of one daemon's ACL (nothing when ACL is off)."""
    if acl is None:
        return
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    denied = CounterMetricFamily("pocketmq_acl_denied", "Requests refused by the ACL, by reason and request "
                                 "code (a gRPC RPC's name for the gRPC endpoint)", labels=labels + ["reason", "code"])
    # (codes are ints, a gRPC RPC's name for the gRPC endpoint's denies)
    for (reason, code), n in sorted(acl.denied.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        denied.add_metric(values + [reason, str(code)], n)
    yield denied
    accounts = GaugeMetricFamily("pocketmq_acl_accounts", "Accounts of the ACL files in force", labels=labels)
    accounts.add_metric(values, len(acl.table.accounts))
    yield accounts
    reloads = CounterMetricFamily("pocketmq_acl_reloads", "ACL reloads after a file change", labels=labels)
    reloads.add_metric(values, acl.reloads)
    yield reloads
    failures = CounterMetricFamily("pocketmq_acl_reload_failures", "ACL file changes refused (the previous "
                                   "accounts stayed in force)", labels=labels)
    failures.add_metric(values, acl.reload_failures)
    yield failures
