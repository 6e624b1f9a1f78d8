"""mqadmin's ACL commands without daemons: RocketMQ 4.9's flags, the session flags kept
apart from updateAclConfig's own -a/-s, the requests ClientAPI builds for codes 50-54, and
the listings (Java's output shapes)."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client.api import ClientAPI
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.tools.mqadmin import acl
from pocketmq.tools.mqadmin.cli import COMMANDS, build_parser, session_parser
from pocketmq.tools.mqadmin.errors import UsageError


def parse(argv: list[str]):
    c = COMMANDS[argv[0]]
    session, rest = session_parser(c).parse_known_args(argv[1:])
    return build_parser(c).parse_args(rest, namespace=session)


def test_commands_registered_with_rocketmq_names():
    for name in ("updateAclConfig", "deleteAclConfig", "clusterAclConfigVersion", "updateGlobalWhiteAddr",
                 "getAclConfig"):
        assert name in COMMANDS


def test_update_acl_config_flags():
    a = parse(["updateAclConfig", "-b", "127.0.0.1:10911", "-a", "userKey01", "-s", "userSecret01",
               "-w", "192.168.0.*", "-i", "DENY", "-u", "SUB", "-t", "topicA=DENY,topicB=PUB|SUB",
               "-g", "groupA=SUB", "-m", "true"])
    assert acl.account_from_flags(a) == {
        "accessKey": "userKey01", "secretKey": "userSecret01", "whiteRemoteAddress": "192.168.0.*",
        "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB", "topicPerms": ["topicA=DENY", "topicB=PUB|SUB"],
        "groupPerms": ["groupA=SUB"], "admin": True}
    # -a/-s are the account written; the session's own flags are not offered for it
    assert not hasattr(a, "session_accessKey") and not hasattr(a, "session_secretKey")


def test_update_acl_config_needs_account():
    with pytest.raises(UsageError):
        parse(["updateAclConfig", "-b", "127.0.0.1:10911", "-a", "userKey01"])


def test_other_commands_take_session_credentials():
    a = parse(["getAclConfig", "-c", "DefaultCluster", "--accessKey", "adminKey1", "--secretKey", "adminSecret1"])
    assert (a.clusterName, a.session_accessKey, a.session_secretKey) == ("DefaultCluster", "adminKey1", "adminSecret1")
    a = parse(["updateGlobalWhiteAddr", "-b", "h:1", "-g", "10.10.103.*,192.168.0.*"])
    assert a.globalWhiteRemoteAddresses == "10.10.103.*,192.168.0.*"
    a = parse(["deleteAclConfig", "-c", "C", "-a", "userKey01"])
    assert a.accessKey == "userKey01"
    a = parse(["clusterAclConfigVersion", "-b", "h:1"])
    assert a.brokerAddr == "h:1"


class _Transport:
    credentials = None

    def __init__(self, answer: RemotingCommand):
        self.sent: list[RemotingCommand] = []
        self.answer = answer

    async def invoke(self, addr, cmd, timeout_s):
        self.sent.append(cmd)
        return self.answer


def _api(code=C.SUCCESS, remark=None, ext=None, body=b""):
    t = _Transport(RemotingCommand(code, remark=remark, ext_fields=ext or {}, body=body))
    return ClientAPI(t), t


def test_api_update_acl_config_header():
    api, t = _api()
    asyncio.run(api.update_acl_config("h:1", {"accessKey": "k1234567", "secretKey": "s1234567", "admin": False,
                                              "topicPerms": ["a=PUB", "b=SUB"], "groupPerms": None}))
    cmd = t.sent[0]
    assert cmd.code == R.UPDATE_AND_CREATE_ACL_CONFIG
    assert cmd.ext_fields == {"accessKey": "k1234567", "secretKey": "s1234567", "admin": "false",
                              "topicPerms": "a=PUB,b=SUB"}


def test_api_other_codes():
    api, t = _api()
    asyncio.run(api.delete_acl_config("h:1", "k1234567"))
    asyncio.run(api.update_global_white_addrs("h:1", "10.*,11.*"))
    assert [(c.code, c.ext_fields) for c in t.sent] == [
        (R.DELETE_ACL_CONFIG, {"accessKey": "k1234567"}),
        (R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": "10.*,11.*"})]
    api, _ = _api(ext={"version": '{"counter":3,"stateVersion":0,"timestamp":1700000000000}',
                       "allAclFileVersion": '{"/x/plain_acl.yml":{"counter":3,"timestamp":1}}',
                       "brokerName": "broker-a", "brokerAddr": "h:1", "clusterName": "C"})
    info = asyncio.run(api.acl_version_info("h:1"))
    assert info["version"]["counter"] == 3 and info["allAclFileVersion"]["/x/plain_acl.yml"]["counter"] == 3
    api, _ = _api(body=b'{"globalWhiteAddrs":["10.*"],"plainAccessConfigs":[]}')
    assert asyncio.run(api.acl_config("h:1")) == {"globalWhiteAddrs": ["10.*"], "plainAccessConfigs": []}


def test_api_failure_keeps_code_and_remark():
    from pocketmq.client.errors import BrokerError
    api, _ = _api(C.DELETE_ACL_CONFIG_FAILED, "The accesskey[k] corresponding to accessConfig has been deleted failed.")
    with pytest.raises(BrokerError) as e:
        asyncio.run(api.delete_acl_config("h:1", "k"))
    assert e.value.code == C.DELETE_ACL_CONFIG_FAILED


def test_listings():
    lines = acl.acl_config_lines({"globalWhiteAddrs": ["10.10.103.*", "192.168.0.*"], "plainAccessConfigs": [
        {"accessKey": "RocketMQ", "secretKey": "12345678", "whiteRemoteAddress": None, "admin": False,
         "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB", "topicPerms": ["topicA=DENY"], "groupPerms": None}]})
    assert lines[:4] == ["", "globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]", "", "accounts:"]
    assert "  accessKey         : RocketMQ" in lines
    assert "  admin             : false" in lines
    assert "  topicPerms        : [topicA=DENY]" in lines
    assert "  whiteRemoteAddress: " in lines
    row = acl.version_row({"clusterName": "C", "brokerName": "broker-a", "brokerAddr": "h:1",
                           "version": {"counter": 7, "timestamp": 0}})
    assert row.split()[:4] == ["C", "broker-a", "h:1", "7"]
    line = acl.account_line({"accessKey": "k1234567", "secretKey": "s1234567", "admin": True,
                             "topicPerms": ["a=PUB"]})
    assert "s1234567" not in line and "accessKey='k1234567'" in line and "topicPerms=[a=PUB]" in line
