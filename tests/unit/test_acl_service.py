"""The plain ACL's shell (remoting/acl.py) without sockets: which files it reads, reloads on
change (a broken file keeps the previous accounts), the guard before every processor, the
rate-limited deny log and its counters; the config keys that turn it on."""
from __future__ import annotations

import logging
import os

import pytest

from pocketmq.broker.config import BrokerConfig
from pocketmq.common.acl import NAMESRV_PROTECTED_CODES
from pocketmq.nameserver.config import NamesrvConfig
from pocketmq.protocol.acl import sign_request
from pocketmq.protocol.codes import FLAG_ONEWAY, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.acl import AclService, acl_files, acl_metrics, default_acl_path

YML = """\
accounts:
  - accessKey: appUser01
    secretKey: appSecret01
    defaultTopicPerm: {perm}
"""


class Conn:
    remote_addr = "10.1.2.3:4567"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))   # a visible change, no sleep


def send(topic="T", ak="appUser01", sk="appSecret01", oneway=False):
    cmd = RemotingCommand(R.SEND_MESSAGE_V2, ext_fields=sign_request({"b": topic, "a": "PG"}, b"x", ak, sk),
                          body=b"x")
    if oneway:
        cmd.flag |= FLAG_ONEWAY
    return cmd


def test_default_path_and_files(tmp_path):
    conf = tmp_path / "conf" / "broker.conf"
    assert default_acl_path(str(conf), None, "/fallback") == str(tmp_path / "conf" / "plain_acl.yml")
    assert default_acl_path(str(conf), "acl/main.yml", "/fb") == str(tmp_path / "conf" / "acl" / "main.yml")
    assert default_acl_path(None, None, "/fallback") == "/fallback/plain_acl.yml"
    assert default_acl_path(None, "/abs/x.yml", "/fb") == "/abs/x.yml"
    main = str(tmp_path / "plain_acl.yml")
    for name in ("acl/b.yml", "acl/a.yaml", "acl/sub/c.yml", "acl/notes.txt"):
        write(str(tmp_path / name), "")
    assert acl_files(main) == [str(tmp_path / n) for n in ("acl/a.yaml", "acl/b.yml", "acl/sub/c.yml")] + [main]


def test_guard_answers_denies_like_java_and_lets_the_rest_through(tmp_path):
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="PUB"))
    acl = AclService(main)
    acl.load()
    seen = []
    table = acl.guard({int(R.SEND_MESSAGE_V2): lambda conn, cmd: seen.append(cmd) or cmd.response(C.SUCCESS)})
    proc = table[int(R.SEND_MESSAGE_V2)]
    assert proc(Conn(), send()).code == C.SUCCESS and len(seen) == 1
    r = proc(Conn(), send(sk="wrongSecret"))
    assert (r.code, r.remark) == (C.SYSTEM_ERROR, "org.apache.rocketmq.acl.common.AclException: Check signature "
                                  "failed for accessKey=appUser01, org.apache.rocketmq.acl.plain."
                                  "PlainPermissionManager.validate(PlainPermissionManager.java:684)")
    assert len(seen) == 1      # the processor never ran: nothing stored
    assert acl.denied == {("signature", 310): 1}


def test_nameserver_guard_checks_only_the_protected_codes(tmp_path):
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="PUB"))
    acl = AclService(main, admin_codes=NAMESRV_PROTECTED_CODES, protected_codes=NAMESRV_PROTECTED_CODES)
    acl.load()
    ok = lambda conn, cmd: cmd.response(C.SUCCESS)   # noqa: E731
    table = acl.guard({int(R.GET_ROUTEINFO_BY_TOPIC): ok, int(R.REGISTER_BROKER): ok})
    assert table[int(R.GET_ROUTEINFO_BY_TOPIC)] is ok
    r = table[int(R.REGISTER_BROKER)](Conn(), RemotingCommand(R.REGISTER_BROKER, ext_fields=sign_request(
        {"brokerName": "b"}, None, "appUser01", "appSecret01")))
    assert "Need admin permission for request code=103, but accessKey=appUser01 is not" in r.remark


def test_reload_on_change_and_a_broken_file_keeps_the_accounts(tmp_path, caplog):
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="DENY"))
    acl = AclService(main)
    acl.load()
    assert not acl.poll()                                  # nothing changed
    assert acl.deny(Conn(), send()) is not None
    write(main, YML.format(perm="PUB"))
    assert acl.poll() and acl.deny(Conn(), send()) is None and acl.reloads == 1
    with caplog.at_level(logging.ERROR, logger="pocketmq.acl"):
        write(main, "accounts:\n  - accessKey: short\n    secretKey: x\n")
        assert not acl.poll()
        assert not acl.poll()                              # the same broken file: one log line
    assert acl.deny(Conn(), send()) is None                # the previous accounts stay
    assert acl.reload_failures == 1 and "plain_acl.yml:2" in acl.last_error
    assert len([r for r in caplog.records if "ACL not reloaded" in r.getMessage()]) == 1
    # a new file in acl/ is seen too, and a fixed main file reloads
    write(str(tmp_path / "acl" / "more.yml"), "accounts:\n  - {accessKey: otherUser, secretKey: otherSecret}\n")
    write(main, YML.format(perm="SUB"))
    assert acl.poll() and set(acl.table.accounts) == {"appUser01", "otherUser"}
    assert acl.deny(Conn(), send()) is not None


def test_a_file_read_with_no_data_keeps_its_accounts_on_reload(tmp_path, caplog):
    """Java's reload of a changed file skips one with no data ("No data in {}, skip it"); an
    editor's truncate-then-write read between the two is such a file (the CI run of 95d5755:
    the ACL fuzz's probe refused "No acl config for appUser01" right after the file was
    written back)."""
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="PUB"))
    acl = AclService(main)
    acl.load()
    with caplog.at_level(logging.WARNING, logger="pocketmq.acl"):
        for empty in ("", "# being edited\n", "{}\n", "~\n"):
            write(main, empty)
            assert acl.poll()                                  # a change, reloaded
            assert acl.deny(Conn(), send()) is None, empty      # the file's accounts stay
            assert set(acl.table.accounts) == {"appUser01"}
    assert sum("has no data" in r.getMessage() for r in caplog.records) == 4
    # the file written again: its new content wins; an explicit empty list does revoke
    write(main, YML.format(perm="SUB"))
    assert acl.poll() and acl.deny(Conn(), send()) is not None
    write(main, "accounts: []\n")
    assert acl.poll() and acl.table.accounts == {}
    # a file that appears with no data has nothing to keep, and at start one is no accounts
    write(str(tmp_path / "acl" / "new.yml"), "")
    assert acl.poll() and acl.table.accounts == {}
    fresh = AclService(str(tmp_path / "acl" / "new.yml"))
    fresh.load()
    assert fresh.table.accounts == {}


async def test_an_admin_edit_of_a_file_kept_without_data_is_refused(tmp_path):
    """A file read with no data keeps its accounts; an admin edit of it (update, delete, the
    white list) would start from the empty text and lose every other account: refused,
    naming the file, the disk and the table left as they were. Editing a file that had no
    data from the start (a new plain_acl.yml) works as before."""
    from pocketmq.common import acl as rules
    team = str(tmp_path / "acl" / "team.yml")
    write(team, "accounts:\n  - {accessKey: teamUser1, secretKey: teamSecret1}\n"
                "  - {accessKey: teamUser2, secretKey: teamSecret2}\n")
    main = str(tmp_path / "plain_acl.yml")
    write(main, "")
    acl = AclService(main)
    acl.load()
    write(team, "")
    assert await acl.poll_async() and set(acl.table.accounts) == {"teamUser1", "teamUser2"}
    edits = [lambda text, v, now: rules.deleted_account_yaml(text, team, "teamUser1", v, now),
             lambda text, v, now: rules.updated_account_yaml(text, team, {"accessKey": "teamUser1",
                                                                           "secretKey": "newSecret1"}, v, now),
             lambda text, v, now: rules.updated_global_white_yaml(text, team, ["10.*"], v, now)]
    for edit in edits:
        with pytest.raises(rules.AclConfigError, match="team.yml has no data on disk"):
            await acl.rewrite(team, edit)
        assert open(team).read() == "" and set(acl.table.accounts) == {"teamUser1", "teamUser2"}
    # the main file was empty from the start: an account is added to it
    assert await acl.rewrite(main, lambda text, v, now: rules.updated_account_yaml(
        text, main, {"accessKey": "mainUser1", "secretKey": "mainSecret1"}, v, now))
    assert set(acl.table.accounts) == {"teamUser1", "teamUser2", "mainUser1"}
    # the team file written again: edits work on it
    write(team, "accounts:\n  - {accessKey: teamUser1, secretKey: teamSecret1}\n"
                "  - {accessKey: teamUser2, secretKey: teamSecret2}\n")
    assert await acl.poll_async()
    assert await acl.rewrite(team, edits[0])
    assert set(acl.table.accounts) == {"teamUser2", "mainUser1"}


async def test_reloads_run_one_at_a_time(tmp_path, monkeypatch):
    """The watcher's reload and an admin edit's overlap: the second read starts after the
    first is installed (each builds on the table in force when it starts)."""
    import asyncio
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="PUB"))
    acl = AclService(main)
    acl.load()
    active = []
    peak = []
    real = acl._read_or_error

    def slow_read():
        active.append(1)
        peak.append(len(active))
        try:
            import time
            time.sleep(0.05)
            return real()
        finally:
            active.pop()
    monkeypatch.setattr(acl, "_read_or_error", slow_read)
    write(main, YML.format(perm="SUB"))
    first = asyncio.ensure_future(acl.poll_async())
    await asyncio.sleep(0)
    write(main, YML.format(perm="DENY"))
    await acl.poll_async()      # (finds nothing left to read when the first read saw DENY)
    assert await first and max(peak) == 1
    assert acl.table.accounts["appUser01"].default_topic_perm == rules_perm("DENY")


def rules_perm(text):
    from pocketmq.common import acl as rules
    return rules.parse_perm(text)


def test_start_refuses_a_broken_file(tmp_path):
    from pocketmq.common.acl import AclConfigError
    main = str(tmp_path / "plain_acl.yml")
    write(main, "accounts: [unclosed")
    with pytest.raises(AclConfigError, match="plain_acl.yml:1"):
        AclService(main).load()
    missing = AclService(str(tmp_path / "none" / "plain_acl.yml"))
    missing.load()                                         # a missing file: no accounts
    assert missing.table.accounts == {}


def test_deny_log_is_rate_limited_per_account_address_code_resource(tmp_path, caplog):
    main = str(tmp_path / "plain_acl.yml")
    write(main, YML.format(perm="DENY"))
    acl = AclService(main, log_interval_s=3600)
    acl.load()
    with caplog.at_level(logging.WARNING, logger="pocketmq.acl"):
        for _ in range(5):
            acl.deny(Conn(), send("T1"))
        acl.deny(Conn(), send("T2"))
        acl.deny(Conn(), send("T1", oneway=True))
    lines = [r.getMessage() for r in caplog.records if "ACL denied" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "code 310 from 10.1.2.3:4567 (accessKey appUser01, resource topic:T1)" in lines[0]
    assert acl.denied == {("default_perm", 310): 7}
    fams = {f.name: f for f in acl_metrics(acl, ["cluster"], ["c"])}
    assert [s.value for s in fams["pocketmq_acl_denied"].samples if s.name.endswith("_total")] == [7]
    assert list(acl_metrics(None, [], [])) == []


def test_config_keys():
    cfg = BrokerConfig(aclEnable=True, aclFilePath="x.yml", accessKey="brokerKey", secretKey="brokerSecret")
    assert cfg.aclEnable and cfg.aclFilePath == "x.yml"
    with pytest.raises(ValueError, match="accessKey and secretKey are set together"):
        BrokerConfig(accessKey="brokerKey")
    with pytest.raises(ValueError, match="longer than 6"):
        BrokerConfig(accessKey="short", secretKey="brokerSecret")
    assert NamesrvConfig(aclEnable=True, aclFilePath="/x.yml").aclEnable
