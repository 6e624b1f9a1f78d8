"""TLS settings without sockets: the daemons' keys and their errors, the client's `tls`
option, the first-byte rule that tells TLS from a RocketMQ frame."""
import ssl

import pytest

from pocketmq.broker.config import BrokerConfig
from pocketmq.broker.config import load_config as load_broker_config
from pocketmq.common.properties_file import ConfigError
from pocketmq.nameserver.config import load_config as load_namesrv_config
from pocketmq.protocol.command import RemotingCommand, encode
from pocketmq.remoting.tls import (
    TlsGate,
    TlsServerMode,
    check_server_settings,
    client_context,
    is_tls_start,
    resolve_client_tls,
    server_config_error,
    server_gate,
)


def test_first_byte_tells_tls_from_a_frame():
    assert is_tls_start(0x16)
    # a RocketMQ frame starts with its big-endian length: 0 for anything under 16 MiB
    assert not is_tls_start(encode(RemotingCommand(10, body=b"x" * 70000))[0])


def test_server_settings_name_the_key():
    assert check_server_settings("disabled", None, None) is None
    assert "tlsServerCertPath" in check_server_settings("enforcing", None, "k.pem")
    assert "tlsServerKeyPath" in check_server_settings("permissive", "c.pem", None)
    assert "one of disabled, permissive, enforcing" in check_server_settings("strict", None, None)
    key, why = server_config_error("enforcing", "/nonexistent/c.pem", "/nonexistent/k.pem")
    assert key == "tlsServerCertPath" and "/nonexistent/c.pem" in why
    assert server_gate("disabled", None, None) is None
    with pytest.raises(ValueError):
        TlsGate("enforcing", None)


@pytest.mark.parametrize("load", [load_broker_config, load_namesrv_config])
def test_daemon_keys(load, tmp_path):
    conf = tmp_path / "d.conf"
    conf.write_text("tlsServerMode=permissive\n")
    with pytest.raises(ConfigError, match="tlsServerCertPath"):
        load(str(conf))
    conf.write_text("tlsServerMode=strict\n")
    with pytest.raises(ConfigError, match="tlsServerMode"):
        load(str(conf))
    conf.write_text(f"tlsServerMode=enforcing\ntlsServerCertPath={tmp_path}/none.pem\ntlsServerKeyPath=k\n")
    with pytest.raises(ConfigError, match="cannot load TLS certificate"):
        load(str(conf))
    conf.write_text("tlsServerMode=disabled\n")
    config, _report = load(str(conf))
    assert config.tlsServerMode is TlsServerMode.disabled


def test_broker_defaults_and_client_side_key():
    cfg = BrokerConfig()
    assert cfg.tlsServerMode == "disabled" and cfg.useTLS is False


def test_client_tls_option():
    assert resolve_client_tls(None) is None and resolve_client_tls(False) is None
    ctx = resolve_client_tls(True)
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname    # RocketMQ's clients' default
    mine = client_context(verify=True)
    assert resolve_client_tls(mine) is mine and mine.check_hostname
    with pytest.raises(TypeError):
        resolve_client_tls("on")


def test_spark_tls_enable_option():
    from pocketmq.spark.options import OptionError, parse_reader_options, parse_writer_options
    assert parse_reader_options({"namesrvAddr": "h:1", "subscribe": "T", "TLSENABLE": "true"}).tls is True
    assert parse_writer_options({"namesrvAddr": "h:1"}).tls is False
    with pytest.raises(OptionError, match="tlsEnable"):
        parse_writer_options({"namesrvAddr": "h:1", "tlsEnable": "yes please"})


def test_bench_tls_and_credentials_need_a_real_cluster(capsys):
    from bench import bench_client
    for argv in (["--fake", "--tls"], ["--fake", "--credentials"], ["--ab", "2", "--tls"]):
        with pytest.raises(SystemExit):
            bench_client.main(argv)
    assert "need a real cluster" in capsys.readouterr().err
