"""tests/support/daemons.py free_port across the processes of one run: a port one process
handed out is claimed in the run's shared folder, and no other process hands it out
(CI: two xdist workers picked the same free port, and the compose broker that bound it
second was refused)."""
import os
import subprocess
import sys

from tests.support import daemons

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PICK = """
import sys
sys.path.insert(0, {root!r})
from tests.support.daemons import free_port, free_broker_port
ports = [free_port() for _ in range({n})]
for _ in range({n} // 4):
    p = free_broker_port()
    ports += [p, p + 1]
print(" ".join(map(str, ports)))
"""


def test_two_processes_of_one_run_never_hand_out_the_same_port(tmp_path):
    env = dict(os.environ, **{daemons.PORT_CLAIMS_ENV: str(tmp_path)})
    n = 400     # ~22,000 ports to pick from: without the claims two sets of 600 share ~16
    procs = [subprocess.Popen([sys.executable, "-c", _PICK.format(root=ROOT, n=n)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    sets = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        sets.append(set(map(int, out.split())))
    assert all(len(s) == n + n // 2 for s in sets)
    assert not sets[0] & sets[1]
    # (free_broker_port passes over a P whose P + 1 is taken: that P stays claimed, unused)
    assert {int(name) for name in os.listdir(tmp_path)} >= sets[0] | sets[1]


def test_a_port_claimed_elsewhere_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv(daemons.PORT_CLAIMS_ENV, str(tmp_path))
    first = daemons.free_port()
    # another process of the run claimed the next port this one would pick
    picks = iter([first + 7, first + 7, first + 9])
    monkeypatch.setattr(daemons.random.Random, "randrange", lambda self, a, b: next(picks))
    (tmp_path / str(first + 7)).touch()
    assert daemons.free_port() == first + 9


def test_without_a_run_folder_this_process_alone_decides(monkeypatch):
    monkeypatch.delenv(daemons.PORT_CLAIMS_ENV, raising=False)
    assert daemons._claim(1) and daemons._claim(1)
