"""bench/bench_client.py's options for quick A/B runs of one harness cell: phase
selection and CPU placement (the harness's --pin)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import bench_client


def test_unknown_phases_and_cluster_flags_without_a_cluster_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_client.main(["--phases", "sync,nope"])
    assert "unknown phases ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_client.main(["--fake", "--pin", "same"])
    assert "--pin apply to the cluster this starts" in capsys.readouterr().err


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell the placements apart")
@pytest.mark.parametrize("mode", ["same", "split"])
def test_pin_places_the_daemons_and_this_process(mode):
    cpus = sorted(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        bench_client.pin(mode, [child.pid])
        servers = {cpus[0]} if mode == "same" else {cpus[-1]}
        client = {cpus[0]} if mode == "same" else set(cpus[:-1])
        assert os.sched_getaffinity(child.pid) == servers
        assert os.sched_getaffinity(0) == client
    finally:
        os.sched_setaffinity(0, mine)
        child.kill()
        child.wait()


def test_no_pin_leaves_placement_alone():
    mine = os.sched_getaffinity(0)
    bench_client.pin("none", [os.getpid()])
    assert os.sched_getaffinity(0) == mine
