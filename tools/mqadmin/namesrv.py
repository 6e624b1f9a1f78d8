"""Nameserver commands: wipeWritePerm, addWritePerm, updateKvConfig, deleteKvConfig,
getNamesrvConfig. Writes go to every nameserver of -n, as Java's tools do."""
from __future__ import annotations

from pocketmq.client.errors import BrokerError, RemotingFailure
from pocketmq.tools.mqadmin.broker import format_config
from pocketmq.tools.mqadmin.command import Command, Opt, Out, stripped
from pocketmq.tools.mqadmin.errors import AdminError, failed
from pocketmq.tools.mqadmin.session import AdminSession


async def _change_write_perm(s: AdminSession, a, out: Out, method, verb: str) -> None:
    brokers, _ = await s.cluster_info()
    if a.brokerName not in brokers:
        known = ", ".join(sorted(brokers)) or "none"
        raise AdminError(f"broker {a.brokerName} is not registered on the nameserver (known brokers: {known})")
    errors = []
    for addr in s.namesrv_addrs:
        try:
            count = await method(a.brokerName, namesrv_addr=addr)
        except RemotingFailure as e:
            out(f"{verb} write perm of broker[{a.brokerName}] in name server[{addr}] Failed")
            errors.append(f"cannot reach nameserver {addr} ({s.reason(e, addr)})")
            continue
        except BrokerError as e:
            out(f"{verb} write perm of broker[{a.brokerName}] in name server[{addr}] Failed")
            errors.append(str(failed(e, f"{verb} write perm of broker {a.brokerName}", f"nameserver {addr}")))
            continue
        out(f"{verb} write perm of broker[{a.brokerName}] in name server[{addr}] OK, {count}")
    if errors:
        raise AdminError("; ".join(errors))


async def wipe_write_perm(s: AdminSession, a, out: Out) -> None:
    await _change_write_perm(s, a, out, s.api.wipe_write_perm, "wipe")


async def add_write_perm(s: AdminSession, a, out: Out) -> None:
    await _change_write_perm(s, a, out, s.api.add_write_perm, "add")


async def update_kv_config(s: AdminSession, a, out: Out) -> None:
    await s.every_namesrv(s.api.put_kv_config, a.namespace, a.key, a.value,
                          what=f"update kv config {a.namespace}/{a.key}")
    out("update kv config in namespace success.")


async def delete_kv_config(s: AdminSession, a, out: Out) -> None:
    await s.every_namesrv(s.api.delete_kv_config, a.namespace, a.key,
                          what=f"delete kv config {a.namespace}/{a.key}")
    out("delete kv config from namespace success.")


async def get_namesrv_config(s: AdminSession, a, out: Out) -> None:
    configs = []
    for addr in s.namesrv_addrs:
        configs.append((addr, await s.one_namesrv(addr, s.api.namesrv_config, what="get nameserver config")))
    for addr, props in configs:
        out(format_config(f"============{addr}============", props))


_B = Opt("b", "brokerName", "broker name", required=True, type=stripped)
_S = Opt("s", "namespace", "set the namespace", required=True, type=stripped)
_K = Opt("k", "key", "set the key name", required=True, type=stripped)

COMMANDS = [
    Command("wipeWritePerm", "Wipe write perm of broker in all name server", [_B], wipe_write_perm),
    Command("addWritePerm", "Add write perm of broker in all name server", [_B], add_write_perm),
    Command("updateKvConfig", "Create or update KV config.", [
        _S, _K, Opt("v", "value", "set the value", required=True, type=stripped),
    ], update_kv_config),
    Command("deleteKvConfig", "Delete KV config.", [_S, _K], delete_kv_config),
    Command("getNamesrvConfig", "Get configs of name server.", [], get_namesrv_config),
]
