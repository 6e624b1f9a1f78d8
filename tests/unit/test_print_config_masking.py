"""`mqbroker -p` / `-m` and `mqnamesrv -p` never print a secret in clear text (issue 32):
the broker's own secretKey and either daemon's TLS key password show as ******; an unset
one stays empty, as every unset key does; the access key (not a secret) is printed."""
from __future__ import annotations

import io

import pytest

from pocketmq.broker import config as broker_config
from pocketmq.common.properties_file import MASKED, format_properties
from pocketmq.nameserver import config as namesrv_config

SECRET = "s3cret-value-42"
PASSWORD = "key-pass-0815"


def _listing(parse_args, argv: list[str]) -> dict[str, str]:
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        parse_args(argv, out=out)
    assert caught.value.code == 0
    text = out.getvalue()
    assert SECRET not in text and PASSWORD not in text
    return dict(line.partition("=")[::2] for line in text.splitlines())


def test_broker_print_config_masks_secret_key_and_tls_password(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=b1\naccessKey=brokerAdmin\nsecretKey={SECRET}\n"
                    f"tlsServerKeyPassword={PASSWORD}\n")
    items = _listing(broker_config.parse_args, ["-c", str(conf), "-p"])
    assert items["secretKey"] == MASKED
    assert items["tlsServerKeyPassword"] == MASKED
    assert items["accessKey"] == "brokerAdmin"
    assert items["brokerName"] == "b1"


def test_broker_print_config_from_command_line_flags_masked():
    items = _listing(broker_config.parse_args, ["--accessKey=brokerAdmin", f"--secretKey={SECRET}", "-p"])
    assert items["secretKey"] == MASKED


def test_broker_print_important_config_masks_too(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"accessKey=brokerAdmin\nsecretKey={SECRET}\ntlsServerKeyPassword={PASSWORD}\n")
    items = _listing(broker_config.parse_args, ["-c", str(conf), "-m"])
    for key in ("secretKey", "tlsServerKeyPassword"):
        if key in items:
            assert items[key] == MASKED


def test_unset_secrets_stay_empty():
    items = _listing(broker_config.parse_args, ["-p"])
    assert items["secretKey"] == ""
    assert items["tlsServerKeyPassword"] == ""
    items = _listing(namesrv_config.parse_args, ["-p"])
    assert items["tlsServerKeyPassword"] == ""


def test_namesrv_print_config_masks_tls_password(tmp_path):
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"tlsServerKeyPassword={PASSWORD}\n")
    items = _listing(namesrv_config.parse_args, ["-c", str(conf), "-p"])
    assert items["tlsServerKeyPassword"] == MASKED
    assert items["listenPort"] == "9876"


def test_format_properties_masks_only_named_keys_that_are_set():
    text = format_properties([("a", "x"), ("secretKey", "y"), ("tlsServerKeyPassword", None)],
                             secret={"secretKey", "tlsServerKeyPassword"})
    assert text == f"a=x\nsecretKey={MASKED}\ntlsServerKeyPassword=\n"


def test_get_broker_config_on_the_wire_masks_the_secrets():
    """GET_BROKER_CONFIG (admin-only under ACL) answers ****** for the broker's own secrets."""
    from types import SimpleNamespace

    from pocketmq.broker.processors.admin import process_get_broker_config
    from pocketmq.protocol.bodies import DataVersion
    from pocketmq.protocol.codes import RequestCode
    from pocketmq.protocol.command import RemotingCommand
    cfg = broker_config.BrokerConfig(accessKey="brokerAdmin", secretKey=SECRET)
    ctx = SimpleNamespace(config=cfg, config_version=[DataVersion()])
    resp = process_get_broker_config(ctx, None, RemotingCommand(RequestCode.GET_BROKER_CONFIG))
    text = resp.body.decode()
    assert SECRET not in text
    props = dict(line.partition("=")[::2] for line in text.splitlines())
    assert props["secretKey"] == MASKED and props["accessKey"] == "brokerAdmin"
