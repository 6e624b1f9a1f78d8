"""The plain ACL's admin codes (Java's AdminBrokerProcessor, 4.5.2+; 54 in 4.6.0-4.9.7).

| code | what | failure |
|---|---|---|
| 50 UPDATE_AND_CREATE_ACL_CONFIG | create or update one account in the file that holds it (new: the main file) | 209 |
| 51 DELETE_ACL_CONFIG | remove one account from its file | 210 |
| 52 GET_BROKER_CLUSTER_ACL_INFO | header: version, allAclFileVersion, brokerName, brokerAddr, clusterName | |
| 53 UPDATE_GLOBAL_WHITE_ADDRS_CONFIG | replace one file's globalWhiteRemoteAddresses | 211 |
| 54 GET_BROKER_CLUSTER_ACL_CONFIG | body: every file's global white addresses and accounts | |

Edits go through the ACL service (remoting/acl.py): one at a time, the file rewritten
atomically (common/files.py) with its other accounts kept and its dataVersion bumped, then
reloaded at once. Who may call them is the ACL check's business (admin accounts only:
common/acl.py BROKER_ADMIN_CODES). With aclEnable=false each answers SYSTEM_ERROR.
"""
from __future__ import annotations

import os

from pocketmq.common import acl as rules
from pocketmq.protocol import bodies
from pocketmq.protocol.acl import field_text
from pocketmq.protocol.codes import ResponseCode as C

_OFF = "The broker does not enable acl (aclEnable=false)"


def _version_json(version: tuple) -> str:
    ts, counter = version
    return bodies.dumps({"counter": counter, "stateVersion": 0, "timestamp": ts}).decode()


async def process_update_acl_config(ctx, conn, cmd):
    acl = ctx.acl
    if acl is None:
        return cmd.response(C.SYSTEM_ERROR, _OFF)
    ext = cmd.ext_fields or {}
    config = rules.account_config(ext)
    ak = config["accessKey"]
    try:
        path = acl.file_of(ak) if ak else acl.main_path
        await acl.rewrite(path, lambda text, version, now: rules.updated_account_yaml(text, path, config,
                                                                                       version, now))
    except (ValueError, TypeError, OSError) as e:
        return cmd.response(C.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, str(e))
    return cmd.response(C.SUCCESS)


async def process_delete_acl_config(ctx, conn, cmd):
    acl = ctx.acl
    if acl is None:
        return cmd.response(C.SYSTEM_ERROR, _OFF)
    ak = (cmd.ext_fields or {}).get("accessKey")
    failed = f"The accesskey[{ak}] corresponding to accessConfig has been deleted failed."
    if not ak or ak not in acl.table.accounts:
        return cmd.response(C.DELETE_ACL_CONFIG_FAILED, failed)
    path = acl.file_of(ak)
    try:
        done = await acl.rewrite(path, lambda text, version, now: rules.deleted_account_yaml(text, path, ak,
                                                                                             version, now))
    except (ValueError, TypeError, OSError) as e:
        return cmd.response(C.DELETE_ACL_CONFIG_FAILED, str(e))
    return cmd.response(C.SUCCESS) if done else cmd.response(C.DELETE_ACL_CONFIG_FAILED, failed)


async def process_update_global_white_addrs(ctx, conn, cmd):
    acl = ctx.acl
    if acl is None:
        return cmd.response(C.SYSTEM_ERROR, _OFF)
    ext = cmd.ext_fields or {}
    raw = ext.get("globalWhiteAddrs")
    failed = f"The globalWhiteAddresses[{raw}] has been updated failed."
    if raw is None:
        return cmd.response(C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, failed)
    addrs = [a for a in raw.split(",") if a]
    path = ext.get("aclFileFullPath") or acl.main_path
    # only a file the ACL reads (Java: under ROCKETMQ_HOME, a .yml): never an arbitrary path
    known = {os.path.abspath(f.path) for f in acl.table.files} | {acl.main_path}
    if os.path.abspath(path) not in known:
        return cmd.response(C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, failed)
    try:
        await acl.rewrite(path, lambda text, version, now: rules.updated_global_white_yaml(text, path, addrs,
                                                                                           version, now))
    except (ValueError, TypeError, OSError) as e:
        return cmd.response(C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, f"{failed} {e}")
    return cmd.response(C.SUCCESS)


def process_get_acl_info(ctx, conn, cmd):
    acl = ctx.acl
    if acl is None:
        return cmd.response(C.SYSTEM_ERROR, _OFF)
    versions = {f.path: {"counter": f.version[1], "stateVersion": 0, "timestamp": f.version[0]}
                for f in acl.table.files}
    cfg = ctx.config
    return cmd.response(C.SUCCESS, ext_fields={
        "version": _version_json(acl.version_of(acl.main_path)),
        "allAclFileVersion": bodies.dumps(versions).decode(),
        "brokerName": cfg.brokerName, "brokerAddr": f"{cfg.brokerIP1}:{ctx.store_host[1]}",
        "clusterName": cfg.brokerClusterName})


def _account_json(a: rules.Account) -> dict:
    c = a.config

    def text(k):
        v = c.get(k)
        return None if v is None else field_text(v)

    def items(k):
        v = c.get(k)
        return [field_text(x) for x in v] if isinstance(v, list) else None
    return {"accessKey": a.access_key, "secretKey": a.secret_key, "whiteRemoteAddress": text("whiteRemoteAddress"),
            "admin": a.admin, "defaultTopicPerm": text("defaultTopicPerm"),
            "defaultGroupPerm": text("defaultGroupPerm"), "topicPerms": items("topicPerms"),
            "groupPerms": items("groupPerms")}


def process_get_acl_config(ctx, conn, cmd):
    acl = ctx.acl
    if acl is None:
        return cmd.response(C.SYSTEM_ERROR, _OFF)
    table = acl.table
    body = {"globalWhiteAddrs": [t for f in table.files for t in f.global_white_text],
            "plainAccessConfigs": [_account_json(a) for a in table.accounts.values()]}
    return cmd.response(C.SUCCESS, body=bodies.dumps(body))
