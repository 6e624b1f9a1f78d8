"""mqadmin's nameserver order and error wording on top of the client's exceptions
(tools/mqadmin/session.py, errors.py): the next nameserver is tried only when one cannot
be reached, an error response is final, and when none answers every one is named."""
from __future__ import annotations

import pytest

from pocketmq.client.errors import RemotingFailure, RequestTimeoutError
from pocketmq.tools.mqadmin.errors import transport_reason
from tests.support.daemons import Cluster, free_port
from tests.support.workloads import run_mqadmin


def one_error_line(r) -> str:
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqadmin: "), r.stderr
    return lines[0]


def test_reasons_read_from_the_client_exceptions():
    # ClientInstance/ClientAPI wrap the remoting error's text and append " (addr)"
    refused = RemotingFailure("cannot connect to 127.0.0.1:9: [Errno 111] Connect call failed "
                              "('127.0.0.1', 9) (127.0.0.1:9)")
    assert transport_reason(refused, addr="127.0.0.1:9") == "connection refused"
    slow = RemotingFailure("cannot connect to 10.0.0.1:9: timeout (10.0.0.1:9)")
    assert transport_reason(slow, addr="10.0.0.1:9", connect_timeout_s=3) == "connect timed out after 3s"
    closed = RemotingFailure("connection to 127.0.0.1:9 closed (127.0.0.1:9)")
    assert transport_reason(closed, addr="127.0.0.1:9") == "connection closed by the server"
    assert transport_reason(RequestTimeoutError("x (a:1)"), 3, addr="a:1") == "no response within 3s"


def test_every_unreachable_nameserver_is_named_in_order():
    p1, p2 = free_port(), free_port()
    line = one_error_line(run_mqadmin("topicList", "-n", f"127.0.0.1:{p1};127.0.0.1:{p2}"))
    assert line == (f"mqadmin: cannot reach any nameserver: 127.0.0.1:{p1} (connection refused); "
                    f"127.0.0.1:{p2} (connection refused)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # start() cleans up after itself when a daemon does not come up
    c = Cluster(str(tmp_path_factory.mktemp("mqadmin_session"))).start()
    yield c
    c.stop()


def test_an_unreachable_nameserver_is_skipped(cluster):
    dead = f"127.0.0.1:{free_port()}"
    r = run_mqadmin("clusterList", "-n", f"{dead};{cluster.namesrv_addr}")
    assert r.returncode == 0, r.stderr
    assert cluster.broker_addr in r.stdout


def test_an_error_response_is_final(cluster):
    # the answering nameserver says the topic does not exist: the unreachable one after
    # it is not tried (its failure would otherwise be the message)
    dead = f"127.0.0.1:{free_port()}"
    line = one_error_line(run_mqadmin("topicRoute", "-n", f"{cluster.namesrv_addr};{dead}", "-t", "NoSuchTopic"))
    assert line == "mqadmin: topic NoSuchTopic does not exist (TOPIC_NOT_EXIST from nameserver)"


def test_a_silent_broker_costs_one_request_and_one_timeout():
    """mqadmin speaks JSON headers without negotiating them first: a broker that accepts and
    never answers gets exactly one request (the command's), and the error names mqadmin's
    own 5 s deadline."""
    import socket
    import struct
    import threading

    from pocketmq.protocol.message import offset_msg_id

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    received = bytearray()

    def swallow():
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.extend(chunk)

    t = threading.Thread(target=swallow, daemon=True)
    t.start()
    try:
        msg_id = offset_msg_id(b"\x7f\x00\x00\x01", port, 0)
        line = one_error_line(run_mqadmin("queryMsgById", "-i", msg_id, "-n", "127.0.0.1:9"))
    finally:
        srv.close()
    t.join(5)
    assert "no response within 5s" in line, line
    (length,) = struct.unpack_from(">i", received, 0)
    assert len(received) == 4 + length, "mqadmin sent more than the one VIEW_MESSAGE_BY_ID request"
