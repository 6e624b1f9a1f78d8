"""Broker commands: getBrokerConfig, updateBrokerConfig, cleanExpiredCQ."""
from __future__ import annotations

from pocketmq.tools.mqadmin.command import Command, Opt, Out, stripped
from pocketmq.tools.mqadmin.errors import AdminError, UsageError
from pocketmq.tools.mqadmin.session import AdminSession

_B = "brokerAddr"
_C = "clusterName"


def format_config(header: str, props: dict[str, str]) -> str:
    """Java's getBrokerConfig block: a `====addr====` line, `%-50s=  %s` lines (sorted here:
    Java prints its hash order), a blank line."""
    lines = [header] + [f"{k:<50}=  {v}" for k, v in sorted(props.items())]
    return "\n".join(lines) + "\n"


async def get_broker_config(s: AdminSession, a, out: Out) -> None:
    if a.brokerAddr:
        props, _ = await s.call(a.brokerAddr, s.api.broker_config, what="get broker config",
                                where=f"broker {a.brokerAddr}")
        out(format_config(f"============{a.brokerAddr}============", props))
        return
    if not a.clusterName:
        raise UsageError("getBrokerConfig needs -b brokerAddr or -c clusterName")
    brokers, clusters = await s.cluster_info()
    masters = await s.cluster_masters(a.clusterName)      # checks the cluster exists and has a master
    for name, master in masters.items():
        props, _ = await s.call(master, s.api.broker_config, what="get broker config",
                                where=f"broker {name} {master}")
        out(format_config(f"============Master: {master}============", props))
        for bid, slave in sorted(brokers[name].broker_addrs.items()):
            if bid == 0:
                continue
            props, _ = await s.call(slave, s.api.broker_config, what="get broker config",
                                    where=f"broker {name} {slave}")
            out(format_config(f"============My Master: {master}=====Slave: {slave}============", props))


async def update_broker_config(s: AdminSession, a, out: Out) -> None:
    targets = await s.broker_or_cluster(a.brokerAddr, a.clusterName, "updateBrokerConfig")
    for addr in targets:
        remark = await s.call(addr, s.api.update_broker_config, {a.key: a.value},
                              what=f"update broker config {a.key}={a.value}", where=f"broker {addr}")
        out(f"update broker config success, {addr}")
        if remark:
            out(f"  note from {addr}: {remark}")


async def clean_expired_cq(s: AdminSession, a, out: Out) -> None:
    if a.brokerAddr:
        targets = [a.brokerAddr]
    elif a.clusterName:
        targets = list((await s.cluster_masters(a.clusterName)).values())
    else:
        targets = list((await s.all_masters()).values())
        if not targets:
            raise AdminError("no master broker is registered on the nameserver")
    for addr in targets:
        remark = await s.call(addr, s.api.clean_expired_consume_queue, what="clean expired consume queues",
                              where=f"broker {addr}")
        out(f"clean expired consume queues of {addr}: {remark or 'done'}")
    out("success")


COMMANDS = [
    Command("getBrokerConfig", "Get broker config by cluster or special broker.", [
        Opt("b", _B, "get which broker", type=stripped, metavar="ip:port"),
        Opt("c", _C, "get which cluster", type=stripped),
    ], get_broker_config),
    Command("updateBrokerConfig", "Update broker's config", [
        Opt("b", _B, "update which broker", type=stripped, metavar="ip:port"),
        Opt("c", _C, "update which cluster", type=stripped),
        Opt("k", "key", "config key", required=True, type=stripped),
        Opt("v", "value", "config value", required=True, type=stripped),
    ], update_broker_config, epilog="Only keys the running broker re-reads at each use can change; the "
                                    "broker refuses any other key, naming the ones it accepts, and writes "
                                    "accepted values into its -c config file."),
    Command("cleanExpiredCQ", "Clean expired ConsumeQueue on broker.", [
        Opt("b", _B, "broker address (default: every master)", type=stripped, metavar="ip:port"),
        Opt("c", _C, "cluster name (default: every master)", type=stripped),
    ], clean_expired_cq),
]
