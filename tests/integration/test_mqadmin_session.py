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
