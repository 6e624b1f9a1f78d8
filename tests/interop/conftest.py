import os
import signal
import subprocess
import sys
import warnings

import pytest

from tests.support.daemons import Cluster

AGENT = os.path.join(os.path.dirname(__file__), "cpp_agent.py")


def _has_wheel() -> bool:
    try:
        import rocketmq.client  # noqa: F401
        return True
    except Exception:
        return False


if not _has_wheel():
    if os.environ.get("CI"):
        raise RuntimeError("CI must have the rocketmq==0.4.4 wheel (pip install -e '.[test]')")
    pytest.skip("the rocketmq==0.4.4 wheel (Apache C++ client) is not installed", allow_module_level=True)


class Agent:
    """Runs cpp_agent.py in a subprocess with HOME in a temp dir."""

    def __init__(self, home: str):
        self.home = home

    def start(self, *args: str, out_path: str | None = None) -> subprocess.Popen:
        env = dict(os.environ, HOME=self.home, PYTHONUNBUFFERED="1")
        out = open(out_path, "w") if out_path else subprocess.PIPE
        return subprocess.Popen([sys.executable, AGENT, *args], stdout=out,
                                stderr=subprocess.PIPE, text=True, env=env)

    def run(self, *args: str, timeout: float = 90) -> list[dict]:
        import json
        p = self.start(*args)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"cpp agent {args} timed out; stderr tail: {err[-2000:]}")
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 and not shutdown_abort(p.returncode, events, err):
            raise AssertionError(f"cpp agent {args} exited {p.returncode}; stderr tail: {err[-2000:]}")
        return events


# The Apache C++ client (rocketmq==0.4.4) sometimes aborts inside its own push consumer's
# shutdown: an uncaught boost::thread_interrupted from one of its threads (SIGABRT; the same
# family as apache/rocketmq-client-cpp issues 202 and 204, "consumer.shutdown will coredump").
# Seen once in CI (2026-11-28); not reproduced in five runs of test_cpp_client.py since.
SHUTDOWN_ABORT = "boost::thread_interrupted"


def shutdown_abort(returncode: int, events: list[dict], err: str) -> bool:
    """The agent died of that abort after it said it was stopping: every delivery the test
    judges was already out, so the run stands (with a warning); any other exit is a failure."""
    if returncode == -signal.SIGABRT and events and events[-1]["event"] == "stopping" and SHUTDOWN_ABORT in err:
        warnings.warn(f"the C++ client aborted in its own shutdown ({SHUTDOWN_ABORT}) after stopping")
        return True
    return False


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return Agent(str(tmp_path_factory.mktemp("cpphome")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("cluster")), broker_args=["--flushDiskType=SYNC_FLUSH"])
    c.start()
    yield c
    c.stop()
