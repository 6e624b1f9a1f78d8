"""broker.config, nameserver.config and common.properties_file: loading RocketMQ-style configs."""
from __future__ import annotations

import io
import os

import pytest
from pydantic import ValidationError

from pocketmq.broker import config as broker_config
from pocketmq.broker.config import BrokerConfig, BrokerRole, FlushDiskType
from pocketmq.nameserver import config as namesrv_config
from pocketmq.nameserver.config import NamesrvConfig
from pocketmq.common.properties_file import (
    ConfigError,
    PropertyLine,
    closest_key,
    parse_bool,
    parse_int,
    parse_properties,
)

# The 2m-2s-async sample (distribution/conf/2m-2s-async/broker-a.properties) plus the
# keys operators usually add, the way they appear in real deployments.
BROKER_A = """\
#  Licensed to the Apache Software Foundation (ASF) under one or more
#  contributor license agreements.
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
deleteWhen=04
fileReservedTime=48
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH

# 名字服务地址 (a UTF-8 comment)
namesrvAddr = 10.0.0.1:9876;10.0.0.2:9876
listenPort = 10911
brokerIP1 = 10.0.0.11
storePathRootDir=/data/rocketmq/store
storePathCommitLog=/data/rocketmq/store/commitlog
mapedFileSizeCommitLog=536870912
autoCreateTopicEnable=false
autoCreateSubscriptionGroup=true
sendMessageThreadPoolNums=16
waitTimeMillsInSendQueue=1000
maxMessageSize=65536
"""

BROKER_A_S = """\
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=1
deleteWhen=04
fileReservedTime=48
brokerRole=SLAVE
flushDiskType=ASYNC_FLUSH
"""


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    monkeypatch.delenv("ROCKETMQ_HOME", raising=False)


def write(tmp_path, text: str, name: str = "broker.conf") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


# ---------------------------------------------------------------------------
# defaults


def test_broker_defaults_are_rocketmq_49():
    config = BrokerConfig()
    assert config.brokerClusterName == "DefaultCluster"
    assert config.brokerName == "broker-a"
    assert config.brokerId == 0
    assert config.listenPort == 10911
    assert config.haListenPort == 10912
    assert config.namesrvAddr is None
    assert config.storePathRootDir == os.path.expanduser("~/store")
    assert config.store_path_commit_log() == os.path.join(os.path.expanduser("~/store"), "commitlog")
    assert config.mappedFileSizeCommitLog == 1073741824
    assert config.mappedFileSizeConsumeQueue == 6000000
    assert config.flushDiskType is FlushDiskType.ASYNC_FLUSH
    assert config.brokerRole is BrokerRole.ASYNC_MASTER
    assert (config.flushIntervalCommitLog, config.flushCommitLogTimed, config.syncFlushTimeout) == (500, True, 5000)
    assert config.autoCreateTopicEnable and config.autoCreateSubscriptionGroup
    assert config.defaultTopicQueueNums == 8
    assert config.longPollingEnable and config.shortPollingTimeMills == 1000
    assert config.maxMessageSize == 4194304
    assert (config.fileReservedTime, config.deleteWhen) == (72, "04")
    assert config.brokerPermission == 6
    assert config.registerNameServerPeriod == 30000
    assert config.flushConsumerOffsetInterval == 5000
    assert config.messageDelayLevel == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert config.delay_levels_ms()[:4] == (1000, 5000, 10000, 30000)
    assert config.delay_levels_ms()[-1] == 7_200_000 and len(config.delay_levels_ms()) == 18
    assert (config.maxTransferBytesOnMessageInMemory, config.maxTransferCountOnMessageInMemory) == (262144, 1024)
    assert config.clusterTopicEnable and config.brokerTopicEnable and not config.traceTopicEnable
    assert config.regionId == "DefaultRegion" and config.traceOn
    assert config.notifyConsumerIdsChangedEnable and not config.aclEnable
    assert config.maxHeldPulls == 100000 and config.maxFrameSize == 16777216
    assert config.serverChannelMaxIdleTimeSeconds == 120
    assert not config.rejectTransactionMessage
    assert config.brokerIP1 and config.brokerIP1 == config.brokerIP2
    assert config.broker_addr() == f"{config.brokerIP1}:10911"


def test_namesrv_addr_default_comes_from_environment(monkeypatch):
    monkeypatch.setenv("NAMESRV_ADDR", "127.0.0.1:9876")
    assert BrokerConfig().namesrvAddr == "127.0.0.1:9876"
    config, report = broker_config.load_config()
    assert config.namesrvAddr == "127.0.0.1:9876"
    assert report.sources["namesrvAddr"] == "environment NAMESRV_ADDR"


def test_bad_namesrv_addr_in_environment_names_the_environment(monkeypatch):
    monkeypatch.setenv("NAMESRV_ADDR", "localhost")
    with pytest.raises(ConfigError) as caught:
        broker_config.load_config()
    assert caught.value.key == "namesrvAddr"
    assert caught.value.source == "environment NAMESRV_ADDR"


def test_namesrv_defaults_are_rocketmq_49():
    config = NamesrvConfig()
    assert config.listenPort == 9876
    assert config.kvConfigPath == os.path.expanduser("~/namesrv/kvConfig.json")
    assert config.configStorePath == os.path.expanduser("~/namesrv/namesrv.properties")
    assert not config.orderMessageEnable and not config.clusterTest
    assert config.productEnvName == "center"
    assert config.brokerChannelExpiredTime == 120000
    assert config.scanNotActiveBrokerInterval == 10000
    assert config.serverChannelMaxIdleTimeSeconds == 120
    assert config.maxFrameSize == 16777216


# ---------------------------------------------------------------------------
# a real broker.conf


def test_realistic_broker_conf_loads(tmp_path):
    path = write(tmp_path, BROKER_A)
    config, report = broker_config.parse_args(["-c", path])
    assert config.brokerName == "broker-a" and config.brokerId == 0
    assert config.fileReservedTime == 48
    assert config.brokerRole is BrokerRole.ASYNC_MASTER
    assert config.namesrvAddr == "10.0.0.1:9876;10.0.0.2:9876"
    assert config.namesrv_addr_list() == ("10.0.0.1:9876", "10.0.0.2:9876")
    assert config.broker_addr() == "10.0.0.11:10911"
    assert config.store_path_commit_log() == "/data/rocketmq/store/commitlog"
    assert config.mappedFileSizeCommitLog == 536870912  # via the old spelling
    assert config.autoCreateTopicEnable is False
    assert config.sendMessageThreadPoolNums == 16
    assert config.waitTimeMillsInSendQueue == 1000
    assert report.config_file == path
    assert report.sources["brokerName"] == f"{path}:{line_of(BROKER_A, 'brokerName')}"
    assert report.unused_keys == ("sendMessageThreadPoolNums", "waitTimeMillsInSendQueue")
    assert report.unused_line() == (
        "accepted but not used by pocketmq: sendMessageThreadPoolNums, waitTimeMillsInSendQueue"
    )
    assert any("mapedFileSizeCommitLog is the old spelling of mappedFileSizeCommitLog" in n for n in report.notes)


def test_slave_sample_loads(tmp_path):
    config, report = broker_config.parse_args(["-c", write(tmp_path, BROKER_A_S)])
    assert config.brokerRole is BrokerRole.SLAVE and config.brokerId == 1
    assert not config.is_master()
    assert report.unused_line() is None


def test_every_key_of_a_printed_config_loads_back(tmp_path):
    original = BrokerConfig(namesrvAddr="127.0.0.1:9876", rocketmqHome="/opt/rocketmq")
    path = write(tmp_path, broker_config.format_config(original))
    reloaded, report = broker_config.load_config(path)
    assert reloaded.model_dump(exclude={"storePathCommitLog"}) == original.model_dump(
        exclude={"storePathCommitLog"}
    )
    assert reloaded.store_path_commit_log() == original.store_path_commit_log()
    assert set(report.sources) == set(BrokerConfig.model_fields)


def test_all_java_keys_are_accepted(tmp_path):
    # a sample of keys from each Java class, including ones pocketmq does not use
    text = """\
transientStorePoolEnable=true
slaveReadEnable=true
serverWorkerThreads=16
clientWorkerThreads=8
useTLS=false
haMasterAddress=10.0.0.1:10912
dLegerPeers=n0-127.0.0.1:40911
mapedFileSizeConsumeQueue=300000
consumerFallbehindThreshold=17179869184
brokerIP2=10.0.0.12
"""
    config, report = broker_config.load_config(write(tmp_path, text))
    assert config.transientStorePoolEnable and config.slaveReadEnable
    assert config.serverWorkerThreads == 16 and config.clientWorkerThreads == 8
    assert config.mappedFileSizeConsumeQueue == 300000
    assert config.consumerFallbehindThreshold == 17179869184
    assert config.ha_server_addr() == "10.0.0.12:10912"
    assert "transientStorePoolEnable" in report.unused_keys
    assert "brokerIP2" not in report.unused_keys


def test_template_keys_rocketmq_never_had_are_ignored_with_a_note(tmp_path):
    text = "storePathConsumeQueue=/data/store/consumequeue\nstorePathIndex=/data/store/index\n"
    _, report = broker_config.load_config(write(tmp_path, text))
    assert report.unused_keys == ("storePathConsumeQueue", "storePathIndex")
    assert any("storePathConsumeQueue is ignored" in note for note in report.notes)


# ---------------------------------------------------------------------------
# precedence


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, BROKER_A)
    config, report = broker_config.parse_args([
        "-c", path, "-n", "127.0.0.1:9876", "--listenPort=20911", "--brokerName", "broker-b",
        "--autoCreateTopicEnable=true",
    ])
    assert config.namesrvAddr == "127.0.0.1:9876"
    assert config.listenPort == 20911
    assert config.haListenPort == 20912  # follows listenPort when not set
    assert config.brokerName == "broker-b"
    assert config.autoCreateTopicEnable is True
    assert report.sources["namesrvAddr"] == "command line -n"
    assert report.sources["listenPort"] == "command line --listenPort"
    assert report.sources["brokerId"].endswith(f":{line_of(BROKER_A, 'brokerId')}")


def test_long_namesrv_option_and_last_flag_wins(tmp_path):
    config, _ = broker_config.parse_args([
        "--namesrvAddr", "a:1", "-n", "b:2", "--configFile", write(tmp_path, BROKER_A_S),
    ])
    assert config.namesrvAddr == "b:2"
    assert config.brokerRole is BrokerRole.SLAVE


def test_file_overrides_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NAMESRV_ADDR", "127.0.0.1:9876")
    config, report = broker_config.load_config(write(tmp_path, BROKER_A))
    assert config.namesrvAddr == "10.0.0.1:9876;10.0.0.2:9876"
    assert report.sources["namesrvAddr"].endswith(f":{line_of(BROKER_A, 'namesrvAddr')}")


def test_explicit_ha_listen_port_is_kept():
    config, _ = broker_config.load_config(overrides={"listenPort": "30911", "haListenPort": "31000"})
    assert (config.listenPort, config.haListenPort) == (30911, 31000)


def test_duplicate_key_in_file_last_wins_with_a_note(tmp_path):
    config, report = broker_config.load_config(write(tmp_path, "listenPort=1000\nlistenPort=2000\n"))
    assert config.listenPort == 2000
    assert any("listenPort is set twice" in note for note in report.notes)


def test_no_arguments_gives_defaults():
    config, report = broker_config.parse_args([])
    assert config.listenPort == 10911
    assert report.config_file is None and report.unused_line() is None


# ---------------------------------------------------------------------------
# errors


def test_unknown_key_in_file_names_key_line_and_suggestion(tmp_path):
    text = BROKER_A + "brokerNmae=broker-c\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["-c", path])
    error = caught.value
    assert error.key == "brokerNmae"
    assert error.source == f"{path}:{line_of(text, 'brokerNmae')}"
    assert "unknown key" in str(error) and "did you mean brokerName?" in str(error)
    assert str(error).startswith(f"{path}:{line_of(text, 'brokerNmae')}: brokerNmae:")


def test_unknown_key_suggestion_ignores_case():
    with pytest.raises(ConfigError, match="did you mean brokerIP1"):
        broker_config.load_config(overrides={"brokerip1": "10.0.0.1"})


def test_unknown_flag_names_the_flag():
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["--autoCreateTopicEnabled=true"])
    assert caught.value.source == "command line --autoCreateTopicEnabled"
    assert "did you mean autoCreateTopicEnable?" in str(caught.value)


@pytest.mark.parametrize(
    ("line", "key", "fragment"),
    [
        ("listenPort=abc", "listenPort", "expected an integer"),
        ("listenPort=-1", "listenPort", "greater than or equal to 0"),
        ("listenPort=65536", "listenPort", "less than or equal to 65535"),
        ("haListenPort=70000", "haListenPort", "less than or equal to 65535"),
        ("autoCreateTopicEnable=yes", "autoCreateTopicEnable", "expected true or false"),
        ("flushDiskType=async_flush", "flushDiskType", "did you mean ASYNC_FLUSH?"),
        ("brokerRole=MASTER", "brokerRole", "ASYNC_MASTER, SYNC_MASTER, SLAVE"),
        ("brokerId=-1", "brokerId", "greater than or equal to 0"),
        ("sendMessageThreadPoolNums=2147483648", "sendMessageThreadPoolNums", "less than or equal to 2147483647"),
        ("mapedFileSizeCommitLog=0", "mappedFileSizeCommitLog", "greater than or equal to 1"),
        ("namesrvAddr=10.0.0.1", "namesrvAddr", "bad name server address"),
        ("namesrvAddr=10.0.0.1:9876;;10.0.0.2:9876", "namesrvAddr", "empty address"),
        ("deleteWhen=25", "deleteWhen", "hours of the day"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel", "bad delay level '5x'"),
        ("brokerPermission=16", "brokerPermission", "less than or equal to 15"),
        ("brokerName=", "brokerName", "at least 1 character"),
        ("enableDLegerCommitLog=true", "enableDLegerCommitLog", "no DLedger"),
    ],
)
def test_bad_value_names_key_and_line(tmp_path, line, key, fragment):
    text = "brokerName=broker-a\n# a comment\n" + line + "\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["-c", path])
    assert caught.value.key == key
    assert caught.value.source == f"{path}:3"
    assert fragment in str(caught.value)


def test_bad_flag_value_names_the_flag():
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["--listenPort", "99999"])
    assert caught.value.key == "listenPort"
    assert caught.value.source == "command line --listenPort"
    assert "65535" in str(caught.value)


def test_slave_needs_a_positive_broker_id(tmp_path):
    text = "brokerRole=SLAVE\nbrokerId=0\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        broker_config.load_config(path)
    assert caught.value.key == "brokerId" and caught.value.source == f"{path}:2"
    assert "SLAVE's brokerId must be > 0" in str(caught.value)


def test_master_with_nonzero_broker_id_is_refused(tmp_path):
    path = write(tmp_path, "brokerId=1\n")
    with pytest.raises(ConfigError) as caught:
        broker_config.load_config(path)
    assert caught.value.key == "brokerId" and caught.value.source == f"{path}:1"
    assert "brokerRole=SLAVE" in str(caught.value)


def test_slave_without_broker_id_blames_the_role(tmp_path):
    path = write(tmp_path, "brokerRole=SLAVE\n")
    with pytest.raises(ConfigError) as caught:
        broker_config.load_config(path)
    assert caught.value.key == "brokerId" and caught.value.source == f"{path}:1"


def test_message_size_must_fit_in_a_frame():
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["--maxMessageSize=16777216"])
    assert caught.value.key == "maxMessageSize"
    assert caught.value.source == "command line --maxMessageSize"


def test_unreadable_file(tmp_path):
    missing = str(tmp_path / "nope.conf")
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(["-c", missing])
    assert caught.value.source == missing and "cannot read" in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["-c"], "needs a value"),
        (["--listenPort"], "needs a value"),
        (["--listenPort", "--brokerId=0"], "needs a value"),
        (["-x"], "unknown option"),
        (["extra"], "unexpected argument"),
        (["-p=1"], "unknown option"),
        (["--printConfigItem=true"], "takes no value"),
        (["-c", "a", "-c", "b"], "more than once"),
    ],
)
def test_malformed_command_lines(argv, fragment):
    with pytest.raises(ConfigError, match=fragment):
        broker_config.parse_args(argv)


def test_malformed_unicode_escape_names_the_line(tmp_path):
    path = write(tmp_path, "brokerName=a\nbrokerClusterName=\\u12G4\n")
    with pytest.raises(ConfigError) as caught:
        broker_config.load_config(path)
    assert caught.value.source == f"{path}:2" and caught.value.key == "brokerClusterName"


# ---------------------------------------------------------------------------
# the model itself


def test_model_forbids_extra_and_validates_assignment():
    with pytest.raises(ValidationError):
        BrokerConfig(brokerNmae="x")
    config = BrokerConfig()
    with pytest.raises(ValidationError):
        config.listenPort = 70000
    with pytest.raises(ValidationError):
        config.listenPort = "10911"  # strict: no silent coercion
    with pytest.raises(ValidationError):
        config.brokerId = 3  # a master's brokerId must be 0
    assert config.brokerId == 0  # a refused assignment changes nothing
    with pytest.raises(ValidationError):
        config.brokerRole = BrokerRole.SLAVE  # a slave with brokerId 0
    assert config.brokerRole is BrokerRole.ASYNC_MASTER
    config = BrokerConfig(brokerRole="SLAVE", brokerId=2)
    config.listenPort = 20000
    assert config.listenPort == 20000 and config.haListenPort == 10912


def test_old_spellings_work_in_the_constructor_too():
    config = BrokerConfig(mapedFileSizeCommitLog=4096, mapedFileSizeConsumeQueue=1000)
    assert config.mappedFileSizeCommitLog == 4096
    assert config.mappedFileSizeConsumeQueue == 1000


def test_consume_queue_size_rounds_up_to_whole_units():
    assert BrokerConfig(mappedFileSizeConsumeQueue=1001).mappedFileSizeConsumeQueue == 1020


def test_home_is_expanded_in_store_paths():
    config = BrokerConfig(storePathRootDir="~/s", storePathCommitLog="~/c")
    assert config.storePathRootDir == os.path.expanduser("~/s")
    assert config.store_path_commit_log() == os.path.expanduser("~/c")


def test_store_config_kwargs():
    config = BrokerConfig(storePathRootDir="/data/store", flushDiskType="SYNC_FLUSH", fileReservedTime=12)
    assert config.store_config_kwargs() == {
        "store_path_root_dir": "/data/store",
        "store_path_commit_log": "/data/store/commitlog",
        "mapped_file_size_commit_log": 1073741824,
        "mapped_file_size_consume_queue": 6000000,
        "flush_disk_type": "SYNC_FLUSH",
        "max_message_size": 4194304,
        "file_reserved_time_hours": 12,
        "message_delay_level": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        "max_transfer_bytes_on_message_in_memory": 262144,
        "max_transfer_count_on_message_in_memory": 1024,
        "max_transfer_bytes_on_message_in_disk": 65536,
        "max_transfer_count_on_message_in_disk": 8,
        "access_message_in_memory_max_ratio": 40,
        "message_index_enable": True,
        "max_hash_slot_num": 5_000_000,
        "max_index_num": 20_000_000,
        "max_msgs_num_batch": 64,
        "index_build_batch": 20_000,
        "total_physical_memory_bytes": 0,
    }
    assert type(config.store_config_kwargs()["flush_disk_type"]) is str


def test_delete_when_hours():
    assert BrokerConfig(deleteWhen="01;13").delete_when_hours() == (1, 13)


# ---------------------------------------------------------------------------
# -p / -m / -h


def test_print_config_item_lists_every_key_and_exits_zero(tmp_path):
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        broker_config.parse_args(["-c", write(tmp_path, BROKER_A), "-p"], out=out)
    assert caught.value.code == 0
    lines = out.getvalue().splitlines()
    keys = [line.partition("=")[0] for line in lines]
    assert keys == list(BrokerConfig.model_fields)
    assert "brokerName=broker-a" in lines
    assert "listenPort=10911" in lines
    assert "autoCreateTopicEnable=false" in lines
    assert "flushDiskType=ASYNC_FLUSH" in lines
    assert "storePathCommitLog=/data/rocketmq/store/commitlog" in lines
    assert "haMasterAddress=" in lines


def test_print_important_config_lists_only_important_keys():
    out = io.StringIO()
    with pytest.raises(SystemExit):
        broker_config.parse_args(["-m", "--brokerName=b1"], out=out)
    keys = {line.partition("=")[0] for line in out.getvalue().splitlines()}
    assert keys == broker_config.IMPORTANT_KEYS
    assert "brokerName=b1" in out.getvalue().splitlines()


def test_bad_config_fails_before_printing(tmp_path):
    out = io.StringIO()
    with pytest.raises(ConfigError):
        broker_config.parse_args(["-p", "--listenPort=x"], out=out)
    assert out.getvalue() == ""


def test_help():
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        broker_config.parse_args(["-h"], out=out)
    assert caught.value.code == 0
    assert "-c,--configFile" in out.getvalue() and "-n,--namesrvAddr" in out.getvalue()


# ---------------------------------------------------------------------------
# name server


def test_namesrv_conf_loads_and_config_store_path_follows_the_file(tmp_path):
    text = "listenPort=9877\norderMessageEnable=true\nkvConfigPath=/data/kv.json\nclusterTest=true\n"
    path = write(tmp_path, text, "namesrv.conf")
    config, report = namesrv_config.parse_args(["-c", path])
    assert config.listenPort == 9877
    assert config.orderMessageEnable is True
    assert config.kvConfigPath == "/data/kv.json"
    assert config.configStorePath == path
    assert report.unused_keys == ("clusterTest",)


def test_namesrv_flags_override_the_file(tmp_path):
    path = write(tmp_path, "listenPort=9877\n", "namesrv.conf")
    config, report = namesrv_config.parse_args(
        ["-c", path, "--listenPort", "9999", "--configStorePath=/etc/ns.properties"]
    )
    assert config.listenPort == 9999
    assert config.configStorePath == "/etc/ns.properties"
    assert report.sources["listenPort"] == "command line --listenPort"


def test_namesrv_errors(tmp_path):
    path = write(tmp_path, "listenPort=9876\nlistenPrt=1\n", "namesrv.conf")
    with pytest.raises(ConfigError) as caught:
        namesrv_config.parse_args(["-c", path])
    assert caught.value.source == f"{path}:2" and "did you mean listenPort?" in str(caught.value)
    with pytest.raises(ConfigError, match="unknown option"):
        namesrv_config.parse_args(["-n", "127.0.0.1:9876"])
    with pytest.raises(ConfigError, match="orderMessageEnable"):
        namesrv_config.parse_args(["--orderMessageEnable=1"])
    with pytest.raises(ConfigError) as caught:
        namesrv_config.parse_args(["--brokerChannelExpiredTime=1000"])
    assert caught.value.key == "brokerChannelExpiredTime"


def test_namesrv_print_config_item():
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        namesrv_config.parse_args(["-p"], out=out)
    assert caught.value.code == 0
    keys = [line.partition("=")[0] for line in out.getvalue().splitlines()]
    assert keys == list(NamesrvConfig.model_fields)
    assert "listenPort=9876" in out.getvalue().splitlines()
    assert "rocketmqHome=" in out.getvalue().splitlines()


# ---------------------------------------------------------------------------
# the .properties parser


def entries(text: str) -> list[tuple[str, str]]:
    return [(entry.key, entry.value) for entry in parse_properties(text)]


def test_properties_separators_and_comments():
    text = (
        "# comment\n"
        "! also a comment\n"
        "   # indented comment\n"
        "\n"
        "a=1\n"
        "b = 2\n"
        "c: 3\n"
        "d 4\n"
        "e\t=\t5\n"
        "f==6\n"
        "g\n"
        "h=\n"
        "  i = 7  \n"
    )
    assert entries(text) == [
        ("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5"), ("f", "=6"),
        ("g", ""), ("h", ""), ("i", "7"),
    ]


def test_properties_continuation_lines_and_line_numbers():
    text = "a=one \\\n    two\\\n\tthree\nb=4\n"
    assert parse_properties(text) == [PropertyLine("a", "one twothree", 1), PropertyLine("b", "4", 4)]


def test_properties_even_backslashes_do_not_continue():
    assert entries("a=x\\\\\nb=y\n") == [("a", "x\\"), ("b", "y")]


def test_properties_comment_does_not_continue_but_continued_hash_is_value():
    assert entries("# c \\\na=1\n") == [("a", "1")]
    assert entries("a=1\\\n# not a comment\n") == [("a", "1# not a comment")]


def test_properties_continuation_at_end_of_file():
    assert entries("a=1\\") == [("a", "1")]


def test_properties_escapes():
    assert entries(r"a=\u0041\u00e9\t\n\r\f\z\\\=") == [("a", "Aé\t\n\r\fz\\=")]
    assert entries("key\\ with\\:odd\\=chars = v") == [("key with:odd=chars", "v")]
    assert entries(r"emoji=\ud83d\ude00") == [("emoji", "\U0001F600")]


def test_properties_malformed_unicode_escape():
    with pytest.raises(ConfigError) as caught:
        parse_properties("a=1\nb=\\u12\n", source="x.conf")
    assert caught.value.source == "x.conf:2" and caught.value.key == "b"


def test_properties_trailing_blanks_trimmed_unless_escaped():
    assert entries("a=1   \nb=2\\ \nc=3\\\\ \n") == [("a", "1"), ("b", "2 "), ("c", "3\\")]


def test_properties_line_endings_and_bom():
    assert entries("\ufeffa=1\r\nb=2\rc=3\n") == [("a", "1"), ("b", "2"), ("c", "3")]


def test_properties_blank_continuation_ends_the_entry():
    assert parse_properties("a=1\\\n\nb=2") == [PropertyLine("a", "1", 1), PropertyLine("b", "2", 3)]


def test_properties_decode_falls_back_to_latin1(tmp_path):
    path = tmp_path / "broker.conf"
    # (regionId: a free-form name; brokerName must be printable ASCII, see below)
    path.write_bytes(b"# caf\xe9\nregionId=b\xe9\n")
    config, _ = broker_config.load_config(str(path))
    assert config.regionId == "b\u00e9"


def test_value_parsers():
    assert parse_bool("TRUE") is True and parse_bool(" false ") is False
    with pytest.raises(ValueError):
        parse_bool("1")
    assert parse_int("+42") == 42 and parse_int("-7") == -7
    for bad in ("1_000", "0x10", "1.0", "", "١"):
        with pytest.raises(ValueError):
            parse_int(bad)


def test_closest_key():
    known = ["brokerName", "brokerClusterName", "listenPort"]
    assert closest_key("brokername", known) == "brokerName"
    assert closest_key("listenport", known) == "listenPort"
    assert closest_key("zzz", known) is None


def test_keys_keep_rocketmq_class_order_around_the_shared_netty_keys():
    # NettyServerConfig's keys are declared once (common.daemon_config) and inherited;
    # -p must still list them where RocketMQ does: after the daemon's own class's keys.
    broker_keys = list(BrokerConfig.model_fields)
    assert broker_keys[0] == "rocketmqHome"
    assert broker_keys[broker_keys.index("configBlackList") + 1] == "listenPort"
    assert broker_keys[broker_keys.index("useEpollNativeSelector") + 1] == "clientWorkerThreads"
    assert broker_keys[-1] == "maxFrameSize"
    namesrv_keys = list(NamesrvConfig.model_fields)
    assert namesrv_keys[0] == "rocketmqHome"
    assert namesrv_keys[namesrv_keys.index("configBlackList") + 1] == "listenPort"
    assert namesrv_keys[namesrv_keys.index("useEpollNativeSelector") + 1] == "scanNotActiveBrokerInterval"
    assert BrokerConfig().listenPort == 10911 and NamesrvConfig().listenPort == 9876


@pytest.mark.parametrize("field", ["brokerName", "brokerClusterName"])
@pytest.mark.parametrize("bad", ["bad name", "b\ud800", "brök", ""])
def test_broker_names_the_nameserver_would_refuse_fail_at_start(field, bad):
    # the nameserver checks these names on REGISTER_BROKER (protocol/names.py); a broker
    # configured with one must not start and then fail every registration
    with pytest.raises(ValidationError, match=field):
        BrokerConfig(**{field: bad})
    assert getattr(BrokerConfig(**{field: "ok-name_1"}), field) == "ok-name_1"


def test_ha_master_address_needs_a_port():
    assert BrokerConfig(haMasterAddress=" 10.0.0.1:10912 ").haMasterAddress == "10.0.0.1:10912"
    assert BrokerConfig(haMasterAddress="").haMasterAddress is None
    with pytest.raises(ValidationError, match="expected host:port"):
        BrokerConfig(haMasterAddress="10.0.0.1")
