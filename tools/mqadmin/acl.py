"""Plain ACL commands: updateAclConfig, deleteAclConfig, clusterAclConfigVersion,
updateGlobalWhiteAddr, getAclConfig (Java 4.9's UpdateAccessConfigSubCommand,
DeleteAccessConfigSubCommand, ClusterAclConfigVersionListSubCommand,
UpdateGlobalWhiteAddrSubCommand, GetAccessConfigSubCommand; same flags and output lines).

Each works on one broker (-b) or a cluster (-c): the writes (update, delete, global white
list) go to every master and slave of the cluster, as Java's do; the reads to its masters.
The broker's admin codes 50-54 need an admin account when the session signs (pocketmq's
brokers require it: `--accessKey/--secretKey` or $ROCKETMQ_ACCESS_KEY/$ROCKETMQ_SECRET_KEY;
updateAclConfig's own -a/-s are the account it writes, so its session credentials come
from the environment only). A deny, or the broker's failure (209 / 210 / 211), is one
`mqadmin: ...` line naming the account and the broker's reason.
"""
from __future__ import annotations

import time

from pocketmq.client.errors import AclDeniedError, BrokerError
from pocketmq.tools.mqadmin.command import Command, Opt, Out, java_bool, stripped
from pocketmq.tools.mqadmin.errors import AdminError, UsageError, failed, one_line
from pocketmq.tools.mqadmin.session import AdminSession


async def _call(s: AdminSession, addr: str, method, *args, what: str):
    try:
        return await s.reach(addr, method, *args)
    except AclDeniedError as e:
        who = f"account {e.account}" if e.account else "an unsigned session (no --accessKey/--secretKey)"
        raise AdminError(f"{what} denied by the ACL of broker {addr} for {who}: "
                         f"{one_line(e.reason) or 'no details'}") from None
    except BrokerError as e:
        raise failed(e, what, f"broker {addr}") from None


async def _targets(s: AdminSession, a, command: str, *, slaves: bool) -> list[str]:
    """-b's address, or the cluster's masters (and slaves: Java's
    fetchMasterAndSlaveAddrByClusterName)."""
    if a.brokerAddr:
        return [a.brokerAddr]
    if not a.clusterName:
        raise UsageError(f"{command} needs -b brokerAddr or -c clusterName")
    if not s.namesrv_addrs:
        raise UsageError(f"{command} -c needs a nameserver (-n or $NAMESRV_ADDR)")
    if not slaves:
        return list((await s.cluster_masters(a.clusterName)).values())
    brokers, clusters = await s.cluster_info()
    if a.clusterName not in clusters:
        known = ", ".join(sorted(clusters)) or "none"
        raise AdminError(f"cluster {a.clusterName} not found on the nameserver (known clusters: {known})")
    addrs = [addr for name in sorted(clusters[a.clusterName]) if name in brokers
             for _, addr in sorted(brokers[name].broker_addrs.items())]
    if not addrs:
        raise AdminError(f"cluster {a.clusterName} has no broker online")
    return addrs


def _perm_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


def account_from_flags(a) -> dict:
    """PlainAccessConfig as Java's command fills it from the flags (lists split on ',')."""
    return {"accessKey": a.accessKey, "secretKey": a.secretKey, "whiteRemoteAddress": a.whiteRemoteAddress,
            "defaultTopicPerm": a.defaultTopicPerm, "defaultGroupPerm": a.defaultGroupPerm,
            "topicPerms": _perm_list(a.topicPerms), "groupPerms": _perm_list(a.groupPerms),
            "admin": a.admin}


def _java_list(items) -> str:
    return "[" + ", ".join("" if x is None else str(x) for x in (items or [])) + "]"


def account_line(c: dict) -> str:
    """Java's PlainAccessConfig.toString(), which updateAclConfig prints (secret masked)."""
    def text(v):
        return "null" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return (f"PlainAccessConfig{{accessKey='{text(c.get('accessKey'))}', secretKey='******', "
            f"whiteRemoteAddress='{text(c.get('whiteRemoteAddress'))}', admin={text(bool(c.get('admin')))}, "
            f"defaultTopicPerm='{text(c.get('defaultTopicPerm'))}', "
            f"defaultGroupPerm='{text(c.get('defaultGroupPerm'))}', topicPerms={_java_list(c.get('topicPerms'))}, "
            f"groupPerms={_java_list(c.get('groupPerms'))}}}")


async def update_acl_config(s: AdminSession, a, out: Out) -> None:
    config = account_from_flags(a)
    for addr in await _targets(s, a, "updateAclConfig", slaves=True):
        await _call(s, addr, s.api.update_acl_config, config,
                    what=f"create or update plain access config {a.accessKey}")
        out(f"create or update plain access config to {addr} success.")
    if a.clusterName and not a.brokerAddr:
        out(f"create or update plain access config to cluster {a.clusterName} success.")
    out(account_line(config))


async def delete_acl_config(s: AdminSession, a, out: Out) -> None:
    for addr in await _targets(s, a, "deleteAclConfig", slaves=True):
        await _call(s, addr, s.api.delete_acl_config, a.accessKey,
                    what=f"delete plain access config {a.accessKey}")
        out(f"delete plain access config account from {addr} success.")
    if a.clusterName and not a.brokerAddr:
        out(f"delete plain access config account from cluster {a.clusterName} success.")


async def update_global_white_addr(s: AdminSession, a, out: Out) -> None:
    addrs = a.globalWhiteRemoteAddresses.strip()
    for addr in await _targets(s, a, "updateGlobalWhiteAddr", slaves=True):
        await _call(s, addr, s.api.update_global_white_addrs, addrs, a.aclFileFullPath,
                    what="update global white remote addresses")
        out(f"update global white remote addresses to {addr} success.")


_VERSION_ROW = "{:<16}  {:<22}  {:<22}  {:<20}  {:<22}"


def version_row(info: dict) -> str:
    version = info.get("version") or {}
    ts = version.get("timestamp") or 0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(ts) / 1000))
    return _VERSION_ROW.format(info.get("clusterName", ""), info.get("brokerName", ""),
                               info.get("brokerAddr", ""), str(version.get("counter", 0)), when).rstrip()


async def cluster_acl_config_version(s: AdminSession, a, out: Out) -> None:
    targets = await _targets(s, a, "clusterAclConfigVersion", slaves=False)
    infos = [await _call(s, addr, s.api.acl_version_info, what="get plain access config version")
             for addr in targets]
    if a.brokerAddr:
        out(version_row(infos[0]))
        out("get broker's plain access config version success.")
        return
    out(_VERSION_ROW.format("#Cluster Name", "#Broker Name", "#Broker Addr", "#AclConfigVersionNum",
                            "#AclLastUpdateTime").rstrip())
    for info in infos:
        out(version_row(info))
    out("get cluster's plain access config version success.")


_ACCOUNT_FIELDS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                   "defaultGroupPerm", "topicPerms", "groupPerms")


def acl_config_lines(config: dict) -> list[str]:
    """GetAccessConfigSubCommand's listing of one broker's answer to code 54."""
    lines = ["", f"{'globalWhiteRemoteAddresses':<20}: {_java_list(config.get('globalWhiteAddrs'))}", "",
             "accounts:"]
    for account in config.get("plainAccessConfigs") or []:
        for field in _ACCOUNT_FIELDS:
            v = account.get(field)
            if isinstance(v, list):
                v = _java_list(v)
            elif isinstance(v, bool):
                v = "true" if v else "false"
            lines.append(f"  {field:<18}: {'' if v is None else v}")
        lines.append("")
    return lines


async def get_acl_config(s: AdminSession, a, out: Out) -> None:
    for addr in await _targets(s, a, "getAclConfig", slaves=False):
        config = await _call(s, addr, s.api.acl_config, what="get plain access config")
        for line in acl_config_lines(config):
            out(line)


_B = "{} which broker"
_C = "{} which cluster"

COMMANDS = [
    Command("updateAclConfig", "Update acl config yaml file in broker", [
        Opt("b", "brokerAddr", _B.format("update acl config file to"), metavar="ip:port", type=stripped),
        Opt("c", "clusterName", _C.format("update acl config file to"), type=stripped),
        Opt("a", "accessKey", "set accessKey in acl config file", required=True, type=stripped),
        Opt("s", "secretKey", "set secretKey in acl config file", required=True, type=stripped),
        Opt("w", "whiteRemoteAddress", "set white ip Address for account in acl config file"),
        Opt("i", "defaultTopicPerm", "set default topicPerm in acl config file"),
        Opt("u", "defaultGroupPerm", "set default GroupPerm in acl config file"),
        Opt("t", "topicPerms", "set topicPerms list,eg: topicA=DENY,topicD=SUB"),
        Opt("g", "groupPerms", "set groupPerms list,eg: groupD=DENY,groupD=SUB"),
        Opt("m", "admin", "set admin flag in acl config file", type=java_bool),
    ], update_acl_config, needs_namesrv=False),
    Command("deleteAclConfig", "Delete Acl Config Account in broker", [
        Opt("b", "brokerAddr", _B.format("delete acl config account from"), metavar="ip:port", type=stripped),
        Opt("c", "clusterName", _C.format("delete acl config account from"), type=stripped),
        Opt("a", "accessKey", "set accessKey in acl config file", required=True, type=stripped),
    ], delete_acl_config, needs_namesrv=False),
    Command("clusterAclConfigVersion", "List all of acl config version information in cluster", [
        Opt("b", "brokerAddr", _B.format("query acl config version for"), metavar="ip:port", type=stripped),
        Opt("c", "clusterName", "query acl config version for specified cluster", type=stripped),
    ], cluster_acl_config_version, needs_namesrv=False),
    Command("updateGlobalWhiteAddr", "Update global white address for acl Config File in broker", [
        Opt("b", "brokerAddr", _B.format("update global white address to"), metavar="ip:port", type=stripped),
        Opt("c", "clusterName", _C.format("update global white address to"), type=stripped),
        Opt("g", "globalWhiteRemoteAddresses", "set globalWhiteRemoteAddress list,eg: 10.10.103.*,192.168.0.*",
            required=True),
        Opt("p", "aclFileFullPath", "the acl file whose list is replaced (default: the broker's plain_acl.yml)"),
    ], update_global_white_addr, needs_namesrv=False),
    Command("getAclConfig", "List all of acl config information in cluster", [
        Opt("b", "brokerAddr", _B.format("query acl config for"), metavar="ip:port", type=stripped),
        Opt("c", "clusterName", "query acl config for specified cluster", type=stripped),
    ], get_acl_config, needs_namesrv=False),
]
