"""End to end: the README's `-n` run hands out tests/conftest.py's groups in its order (long
tiers first, unit tests last). tests/unit/test_test_order.py calls the hook with a worker's
config; this runs real pytest-xdist workers on dummy modules, so a change in how xdist
collects or schedules (it once reordered groups by size, and resets numprocesses on the
workers) shows here."""
import os
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_TEST = '''import os


def _log(name):
    with open(os.path.join({out!r}, os.environ.get("PYTEST_XDIST_WORKER", "main")), "a") as f:
        f.write(name + "\\n")
'''


def test_two_workers_take_the_long_tiers_first_and_the_unit_tests_last(tmp_path):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        addopts = tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"]
    out = tmp_path / "order"
    out.mkdir()
    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), proj / "tests" / "conftest.py")
    (proj / "tests" / "__init__.py").write_text("")
    # unit modules first in collection order (and the largest: xdist's own reorder would put
    # them first too), the long tiers after them
    modules = {"unit": [f"test_u{i}" for i in range(4)], "integration": ["test_g"], "spark": ["test_s1", "test_s2"],
               "interop": ["test_i"], "chaos": ["test_c"], "fault": ["test_f"]}
    for tier, names in modules.items():
        d = proj / "tests" / tier
        d.mkdir()
        (d / "__init__.py").write_text("")
        for name in names:
            n = 12 if tier == "unit" else 2
            body = _TEST.format(out=str(out)) + "".join(
                f"\n\ndef test_{k}():\n    _log('{tier}/{name}')\n" for k in range(n))
            (d / f"{name}.py").write_text(body)
    (proj / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts}\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"],
                       cwd=proj, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = {w.name: w.read_text().split() for w in out.iterdir()}
    assert sorted(runs) == ["gw0", "gw1"], runs
    # each worker runs the groups in tests/conftest.py's tier order (pytest's own order,
    # alphabetical by folder, is chaos, fault, integration, interop, spark, unit; xdist's
    # reorder would take the 12-test unit modules first), spark first of all
    rank = {"spark": 0, "chaos": 1, "interop": 2, "fault": 3, "integration": 4, "unit": 5}
    for worker, names in runs.items():
        ranks = [rank[n.split("/")[0]] for n in names]
        assert ranks == sorted(ranks), (worker, names)
    assert {names[0].split("/")[0] for names in runs.values()} == {"spark", "chaos"}, runs
    spark_workers = [w for w, names in runs.items() if any(n.startswith("spark/") for n in names)]
    assert len(spark_workers) == 1, runs
    assert sum(len(v) for v in runs.values()) == 4 * 12 + 6 * 2
