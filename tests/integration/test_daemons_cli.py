"""The console scripts as a user runs them: pocketmq dev --demo, config errors, clean shutdown."""
import asyncio
import shutil
import subprocess
import sys

import pytest

from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.support.daemons import Cluster, free_port


def _script(name):
    return [shutil.which(name)] if shutil.which(name) else [sys.executable, "-m",
                                                             {"mqbroker": "pocketmq.broker", "mqnamesrv": "pocketmq.nameserver",
                                                              "pocketmq": "pocketmq"}[name]]


def test_pocketmq_dev_demo(tmp_path):
    p = subprocess.run(_script("pocketmq") + ["dev", "--demo", "--dir", str(tmp_path / "dev"),
                                              f"--namesrv-port={free_port()}", f"--broker-port={free_port()}"],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"store in {tmp_path / 'dev'}" in p.stdout
    assert p.stdout.count("received msgId=") == 5
    assert "5 messages consumed" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--listenPortt=1"], "listenPortt"),
    (["--listenPort=abc"], "listenPort"),
    (["--flushDiskType=SOMETIMES"], "flushDiskType"),
])
def test_broker_bad_config_stops_startup_naming_the_key(tmp_path, args, needle):
    p = subprocess.run(_script("mqbroker") + [f"--storePathRootDir={tmp_path}"] + args,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr


def test_broker_conf_file_with_unknown_key(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerNmae=oops\n")
    p = subprocess.run(_script("mqbroker") + ["-c", str(conf)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "brokerNmae" in p.stderr and "broker.conf:3" in p.stderr


def test_sigterm_shuts_down_cleanly_and_unregisters(tmp_path):
    c = Cluster(str(tmp_path)).start()
    try:
        async def route_brokers():
            cli = RemotingClient()
            try:
                r = await cli.invoke(c.namesrv_addr, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
                assert r.code == ResponseCode.SUCCESS
                from pocketmq.protocol.bodies import decode_cluster_info
                return decode_cluster_info(r.body)[0]
            finally:
                await cli.close()
        assert "broker-a" in asyncio.run(route_brokers())
        assert c.broker.stop() == 0
        assert "shutdown complete" in c.broker.log_text()
        assert asyncio.run(route_brokers()) == {}
        store = tmp_path / "store"
        assert not (store / "abort").exists()
        assert (store / "config" / "topics.json").exists()
        assert (store / "config" / "consumerOffset.json").exists()
    finally:
        c.stop()
