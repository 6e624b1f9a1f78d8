"""`mqadmin` end to end: a real mqnamesrv + mqbroker, the CLI run as a subprocess.

The pure formatting helpers (tools/mqadmin/tables.py) and the command-line
handling that needs no server are tested first; the cluster tests share one
module-scoped cluster and run in file order (create -> send -> inspect -> delete).
"""
from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from pocketmq.tools.mqadmin import tables as T
from pocketmq.tools.mqadmin.cli import main as admin_main
from pocketmq.tools.mqadmin.errors import transport_reason
from tests.support.daemons import Cluster, free_port
from tests.support.workloads import poll_until, run_mqadmin

CLI_TIMEOUT_S = 30
TOPIC = "MqadminTopic"
GROUP = "mqadmin_group"


def run_cli(*args, env_extra=None, timeout=CLI_TIMEOUT_S):
    return run_mqadmin(*args, env_extra=env_extra, timeout_s=timeout)


def assert_clean_failure(r, *needles):
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mqadmin: "), r.stderr
    for n in needles:
        assert n in lines[0], r.stderr


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """Rows (split on 2+ spaces) of the table whose header starts with first_header."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(first_header))
    rows = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        rows.append(re.split(r"\s{2,}", ln.strip()))
    return rows


# --------------------------------------------------------------------------- pure formatting

class TestTables:
    def test_table_aligns_columns_to_widest_cell(self):
        out = T.format_table(["#A", "#Long Header"], [("x", 1), ("longer-value", 22)])
        lines = out.splitlines()
        assert lines[0] == "#A            #Long Header"
        assert lines[1] == "x             1"
        assert lines[2] == "longer-value  22"
        # every column starts at the same position on every line
        assert {ln.index(c) for ln, c in zip(lines, ["#Long", "1", "22"])} == {14}

    def test_right_alignment_and_no_trailing_blanks(self):
        out = T.format_table(["#N", "#Name"], [(5, ""), (123, "b")], right=[0])
        assert out.splitlines() == [" #N  #Name", "  5", "123  b"]
        assert all(ln == ln.rstrip() for ln in out.splitlines())

    def test_empty_table_is_just_the_header(self):
        assert T.format_table(["#A", "#B"], []) == "#A  #B"

    def test_row_width_mismatch_is_an_error(self):
        with pytest.raises(ValueError):
            T.format_table(["#A", "#B"], [(1,)])

    def test_cells(self):
        out = T.format_table(["a", "b", "c", "d"], [(None, True, 1.5, "x")])
        assert out.splitlines()[1].split() == ["true", "1.50", "x"]

    def test_human_ms(self):
        assert T.human_ms(0) == "" and T.human_ms(-1) == "" and T.human_ms(None) == ""
        s = T.human_ms(1_700_000_000_123)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,123", s)

    def test_perm_string(self):
        assert T.perm_string(6) == "RW-"
        assert T.perm_string(4) == "R--"
        assert T.perm_string(2) == "-W-"
        assert T.perm_string(7) == "RWX"

    def test_topic_config_line(self):
        assert T.topic_config_line("T", 8, 4, 6) == (
            "TopicConfig [topicName=T, readQueueNums=8, writeQueueNums=4, perm=RW-, "
            "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]")

    def test_properties_like_a_java_map(self):
        assert T.format_properties({"TAGS": "a", "KEYS": "k"}) == "{KEYS=k, TAGS=a}"
        assert T.format_properties({}) == "{}"

    def test_body_undecodable_bytes_are_escaped(self):
        assert T.decode_body(b"ok\xff") == "ok\\xff"
        assert T.decode_body("héllo".encode()) == "héllo"

    def test_format_message(self):
        msg = SimpleNamespace(topic="T", queue_id=3, queue_offset=7, commit_log_offset=1234,
                              reconsume_times=0, born_timestamp=1_700_000_000_000,
                              store_timestamp=1_700_000_000_001, born_host="10.0.0.5:5555",
                              store_host="10.0.0.1:10911", sys_flag=0,
                              properties={"TAGS": "TagA", "KEYS": "k1", "UNIQ_KEY": "AB"}, body=b"hello")
        out = T.format_message(msg, "0A00000100002A9F00000000000004D2")
        lines = dict(re.split(r":\s+", ln, maxsplit=1) for ln in out.splitlines())
        assert lines["OffsetID"] == "0A00000100002A9F00000000000004D2"
        assert lines["Tags"] == "[TagA]" and lines["Keys"] == "[k1]"
        assert lines["Queue ID"] == "3" and lines["Queue Offset"] == "7"
        assert lines["CommitLog Offset"] == "1234"
        assert lines["Store Host"] == "10.0.0.1:10911"
        assert lines["Properties"] == "{KEYS=k1, TAGS=TagA, UNIQ_KEY=AB}"
        assert lines["Message Body"] == "hello"
        # values start in the same column (label padded to 20)
        assert [ln[21:] for ln in out.splitlines()[:2]] == ["0A00000100002A9F00000000000004D2", "T"]

    def test_format_json_handles_object_keys(self):
        out = T.format_json({"offsetTable": {(("brokerName", "b"), ("queueId", 0), ("topic", "T")): 1},
                             "brokerAddrs": {0: "a"}})
        assert '"0": "a"' in out
        assert '"{\\"brokerName\\":\\"b\\",\\"queueId\\":0,\\"topic\\":\\"T\\"}": 1' in out

    def test_command_list(self):
        out = T.format_command_list([("a", "first"), ("longer", "second")])
        assert "   a       first" in out and "   longer  second" in out
        assert "mqadmin help <command>" in out

    def test_transport_reasons(self):
        from pocketmq.remoting.connection import ConnectionClosed, RequestTimeout
        assert transport_reason(ConnectionClosed(
            "cannot connect to 127.0.0.1:9: [Errno 111] Connect call failed ('127.0.0.1', 9)")) == "connection refused"
        assert transport_reason(ConnectionClosed("cannot connect to 1.2.3.4:9: timeout")).startswith("connect timed out")
        assert transport_reason(RequestTimeout("x"), 5) == "no response within 5s"


# --------------------------------------------------------------------------- CLI without servers

class TestCommandLine:
    def test_no_command_prints_the_list(self, capsys):
        assert admin_main([]) == 0
        out = capsys.readouterr().out
        for name in ("updateTopic", "deleteTopic", "topicList", "topicRoute", "topicStatus", "clusterList",
                     "consumerProgress", "sendMessage", "queryMsgById"):
            assert name in out
        assert admin_main(["-h"]) == 0

    def test_help_for_a_command_lists_its_flags(self, capsys):
        assert admin_main(["help", "updateTopic"]) == 0
        out = capsys.readouterr().out
        for flag in ("-n", "-t", "-c", "-b", "-r", "-w", "-p", "-o"):
            assert re.search(rf"(^|\s){flag}[ ,]", out), flag
        assert admin_main(["sendMessage", "-h"]) == 0

    def test_unknown_command(self, capsys):
        assert admin_main(["nope"]) == 2
        assert "unknown command 'nope'" in capsys.readouterr().err
        assert admin_main(["help", "nope"]) == 2

    def test_missing_required_flag(self, capsys):
        assert admin_main(["topicRoute", "-n", "127.0.0.1:9"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "-t/--topic" in err

    def test_missing_namesrv(self, capsys, monkeypatch):
        monkeypatch.delenv("NAMESRV_ADDR", raising=False)
        assert admin_main(["topicList"]) == 2
        assert "NAMESRV_ADDR" in capsys.readouterr().err

    def test_bad_namesrv_address(self, capsys):
        assert admin_main(["topicList", "-n", "nocolon"]) == 2
        assert "bad nameserver address 'nocolon'" in capsys.readouterr().err

    def test_bad_numbers(self, capsys):
        assert admin_main(["updateTopic", "-n", "127.0.0.1:9", "-t", "T", "-c", "C", "-r", "x"]) == 2
        assert admin_main(["updateTopic", "-n", "127.0.0.1:9", "-t", "T", "-c", "C", "-w", "0"]) == 2
        assert admin_main(["updateTopic", "-n", "127.0.0.1:9", "-t", "T", "-c", "C", "-p", "99"]) == 2

    def test_reset_timestamps(self, capsys, monkeypatch):
        import time as _time

        from pocketmq.tools.mqadmin.offset import reset_timestamp as _reset_timestamp
        monkeypatch.setenv("TZ", "UTC")
        _time.tzset()
        try:
            assert _reset_timestamp("1700000000123") == 1700000000123
            assert _reset_timestamp("-1") == -1
            assert _reset_timestamp("2023-11-14#22:13:20:123") == 1700000000123
            assert abs(_reset_timestamp("now") - _time.time() * 1000) < 5000
        finally:
            monkeypatch.delenv("TZ")
            _time.tzset()
        for bad in ("-2", "yesterday", "2023-11-14 22:13:20", "2023-13-01#00:00:00:000"):
            assert admin_main(["resetOffsetByTime", "-n", "127.0.0.1:9", "-g", "G", "-t", "T", "-s", bad]) == 2
            assert "bad timestamp" in capsys.readouterr().err

    def test_update_topic_needs_a_target(self, capsys):
        assert admin_main(["updateTopic", "-n", "127.0.0.1:9", "-t", "T"]) == 2
        assert "-c clusterName or -b brokerAddr" in capsys.readouterr().err

    def test_send_queue_needs_broker(self, capsys):
        assert admin_main(["sendMessage", "-n", "127.0.0.1:9", "-t", "T", "-p", "x", "-i", "0"]) == 2

    def test_bad_message_id(self, capsys):
        assert admin_main(["queryMsgById", "-i", "XYZ"]) == 1
        err = capsys.readouterr().err
        assert "bad message id 'XYZ'" in err and "Traceback" not in err

    def test_unreachable_nameserver_subprocess(self):
        port = free_port()      # nothing listens there
        r = run_cli("topicList", "-n", f"127.0.0.1:{port}")
        assert_clean_failure(r, f"cannot reach nameserver 127.0.0.1:{port}", "connection refused")
        assert r.stdout == ""

    def test_unreachable_nameserver_from_env(self):
        port = free_port()
        r = run_cli("clusterList", env_extra={"NAMESRV_ADDR": f"127.0.0.1:{port}"})
        assert_clean_failure(r, f"127.0.0.1:{port}", "connection refused")

    def test_unreachable_broker_in_message_id(self):
        from pocketmq.protocol.message import offset_msg_id
        port = free_port()
        mid = offset_msg_id(b"\x7f\x00\x00\x01", port, 0)
        r = run_cli("queryMsgById", "-i", mid)
        assert_clean_failure(r, f"cannot reach broker 127.0.0.1:{port}", "connection refused")


# --------------------------------------------------------------------------- real cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mqadmin"))
    c = Cluster(root)
    try:
        c.start()
    except Exception as e:  # noqa: BLE001 - report any start failure as a test failure
        c.stop()
        pytest.fail(f"cluster did not start: {e}")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def state():
    return {}


def ns(cluster):
    return ["-n", cluster.namesrv_addr]


wait_for = poll_until


class TestAgainstCluster:
    def test_cluster_list(self, cluster):
        r = run_cli("clusterList", *ns(cluster))
        assert r.returncode == 0, r.stderr
        rows = table_rows(r.stdout, "#Cluster Name")
        assert any(row[0] == "DefaultCluster" and row[2] == "0" and row[3] == cluster.broker_addr for row in rows), \
            r.stdout

    def test_update_topic_then_topic_list(self, cluster):
        r = run_cli("updateTopic", *ns(cluster), "-c", "DefaultCluster", "-t", TOPIC, "-r", "4", "-w", "4")
        assert r.returncode == 0, r.stderr
        assert f"create topic to {cluster.broker_addr} success." in r.stdout
        assert f"TopicConfig [topicName={TOPIC}, readQueueNums=4, writeQueueNums=4, perm=RW-" in r.stdout
        # the broker re-registers with the nameserver right after the change
        listed = wait_for(lambda: TOPIC in run_cli("topicList", *ns(cluster)).stdout.split())
        assert listed

    def test_update_topic_by_broker_addr(self, cluster):
        r = run_cli("updateTopic", *ns(cluster), "-b", cluster.broker_addr, "-t", TOPIC + "_B")
        assert r.returncode == 0, r.stderr
        assert "readQueueNums=8, writeQueueNums=8" in r.stdout

    def test_update_topic_unknown_cluster(self, cluster):
        r = run_cli("updateTopic", *ns(cluster), "-c", "NoSuchCluster", "-t", TOPIC)
        assert_clean_failure(r, "cluster NoSuchCluster not found", "DefaultCluster")

    def test_topic_route(self, cluster):
        import json
        r = run_cli("topicRoute", *ns(cluster), "-t", TOPIC)
        assert r.returncode == 0, r.stderr
        route = json.loads(r.stdout)
        assert route["brokerDatas"][0]["brokerAddrs"]["0"] == cluster.broker_addr
        qd = route["queueDatas"][0]
        assert qd["readQueueNums"] == 4 and qd["writeQueueNums"] == 4 and qd["perm"] == 6
        assert "\n    " in r.stdout   # pretty printed

    def test_send_message(self, cluster, state):
        r = run_cli("sendMessage", *ns(cluster), "-t", TOPIC, "-p", "hello mqadmin", "-k", "key1", "-c", "TagA",
                    "-b", "broker-a", "-i", "2")
        assert r.returncode == 0, r.stderr
        rows = table_rows(r.stdout, "#Broker Name")
        assert len(rows) == 1
        broker_name, qid, status, msg_id, offset_msg_id, queue_offset = rows[0]
        assert (broker_name, qid, status, queue_offset) == ("broker-a", "2", "SEND_OK", "0")
        assert re.fullmatch(r"[0-9A-F]{32}", msg_id)
        assert re.fullmatch(r"[0-9A-F]{32}", offset_msg_id) and offset_msg_id != msg_id
        state["msg_id"], state["offset_msg_id"] = msg_id, offset_msg_id

    def test_send_message_bad_queue(self, cluster):
        r = run_cli("sendMessage", *ns(cluster), "-t", TOPIC, "-p", "x", "-b", "broker-a", "-i", "9")
        assert_clean_failure(r, "queue 9 is not a writable queue")

    def test_topic_status_shows_the_message(self, cluster):
        r = run_cli("topicStatus", *ns(cluster), "-t", TOPIC)
        assert r.returncode == 0, r.stderr
        rows = table_rows(r.stdout, "#Broker Name")
        assert [row[1] for row in rows] == ["0", "1", "2", "3"]
        by_qid = {row[1]: row for row in rows}
        assert by_qid["2"][2:4] == ["0", "1"]                 # min 0, max 1
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", by_qid["2"][4])
        assert all(by_qid[q][2:4] == ["0", "0"] for q in ("0", "1", "3"))

    def test_query_msg_by_id_shows_the_body(self, cluster, state):
        assert "offset_msg_id" in state, "sendMessage test did not run"
        r = run_cli("queryMsgById", *ns(cluster), "-i", state["offset_msg_id"])
        assert r.returncode == 0, r.stderr
        fields = dict(re.split(r":\s+", ln, maxsplit=1) for ln in r.stdout.splitlines() if ":" in ln)
        assert fields["OffsetID"] == state["offset_msg_id"]
        assert fields["Topic"] == TOPIC
        assert fields["Tags"] == "[TagA]" and fields["Keys"] == "[key1]"
        assert fields["Queue ID"] == "2" and fields["Queue Offset"] == "0"
        assert fields["Store Host"] == cluster.broker_addr
        assert f"UNIQ_KEY={state['msg_id']}" in fields["Properties"]
        assert fields["Message Body"] == "hello mqadmin"

    def test_query_msg_by_id_unknown_offset(self, cluster, state):
        from pocketmq.protocol.message import offset_msg_id, parse_host
        host, port = parse_host(cluster.broker_addr)
        r = run_cli("queryMsgById", "-i", offset_msg_id(host, port, 10**9))
        assert_clean_failure(r, "not found on broker " + cluster.broker_addr)

    def test_consumer_progress(self, cluster):
        from pocketmq.protocol.codes import RequestCode, ResponseCode
        from pocketmq.protocol.command import RemotingCommand
        from pocketmq.remoting.client import RemotingClient

        async def commit():
            client = RemotingClient()
            try:
                resp = await client.invoke(cluster.broker_addr, RemotingCommand(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    ext_fields={"consumerGroup": GROUP, "topic": TOPIC, "queueId": "2", "commitOffset": "1"}), 5.0)
                assert resp.code == ResponseCode.SUCCESS, resp
            finally:
                await client.close()
        asyncio.run(asyncio.wait_for(commit(), 10))

        r = run_cli("consumerProgress", *ns(cluster), "-g", GROUP)
        assert r.returncode == 0, r.stderr
        rows = table_rows(r.stdout, "#Topic")
        by_qid = {row[2]: row for row in rows if row[0] == TOPIC}
        assert set(by_qid) == {"0", "1", "2", "3"}
        assert by_qid["2"][1] == "broker-a"
        assert by_qid["2"][3:6] == ["1", "1", "0"]           # broker offset, consumer offset, diff
        assert "Diff Total: 0" in r.stdout

        r = run_cli("consumerProgress", *ns(cluster), "-g", GROUP, "-t", TOPIC)
        assert r.returncode == 0, r.stderr
        assert len(table_rows(r.stdout, "#Topic")) == 4

    def test_consumer_progress_unknown_group(self, cluster):
        r = run_cli("consumerProgress", *ns(cluster), "-g", "never_consumed_group")
        assert_clean_failure(r, "never_consumed_group")

    def test_delete_topic_then_route_fails(self, cluster):
        r = run_cli("deleteTopic", *ns(cluster), "-c", "DefaultCluster", "-t", TOPIC)
        assert r.returncode == 0, r.stderr
        assert f"delete topic [{TOPIC}] from cluster [DefaultCluster] success." in r.stdout
        assert f"delete topic [{TOPIC}] from NameServer success." in r.stdout

        r = run_cli("topicRoute", *ns(cluster), "-t", TOPIC)
        assert_clean_failure(r, f"topic {TOPIC} does not exist", "TOPIC_NOT_EXIST from nameserver")
        assert r.stdout == ""

        # a later broker re-registration must not bring it back
        r = run_cli("topicList", *ns(cluster))
        assert r.returncode == 0 and TOPIC not in r.stdout.split()

    def test_topic_status_of_unknown_topic(self, cluster):
        r = run_cli("topicStatus", *ns(cluster), "-t", "NoSuchTopicHere")
        assert_clean_failure(r, "topic NoSuchTopicHere does not exist")
