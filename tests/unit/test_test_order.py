"""The README's test command relies on tests/conftest.py's order of groups (long tiers first,
unit tests last) reaching xdist's scheduler, whose collection comes from the workers."""
from types import SimpleNamespace

from tests import conftest


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.marks = []

    def add_marker(self, mark):
        self.marks.append(mark)


_IDS = ["tests/unit/test_a.py::t1", "tests/integration/test_b.py::t1", "tests/unit/test_a.py::t2",
        "tests/spark/test_s.py::t1", "tests/interop/test_c.py::t1", "tests/chaos/test_x.py::t1",
        "tests/fault/test_f.py::t1", "tests/spark/test_t.py::t1", "tests/integration/test_b.py::t2"]
_SORTED = ["tests/spark/test_s.py::t1", "tests/spark/test_t.py::t1", "tests/chaos/test_x.py::t1",
           "tests/interop/test_c.py::t1", "tests/fault/test_f.py::t1", "tests/integration/test_b.py::t1",
           "tests/integration/test_b.py::t2", "tests/unit/test_a.py::t1", "tests/unit/test_a.py::t2"]


def _collect(config):
    items = [_Item(i) for i in _IDS]
    conftest.pytest_collection_modifyitems(config, items)
    return items


def test_a_worker_sorts_the_long_tiers_first_though_xdist_reset_its_numprocesses():
    # what a pytest-xdist worker's config looks like: numprocesses None, workerinput set
    worker = SimpleNamespace(option=SimpleNamespace(numprocesses=None), workerinput={"workerid": "gw0"})
    assert [i.nodeid for i in _collect(worker)] == _SORTED


def test_the_controller_sorts_too_and_a_plain_run_keeps_the_collection_order():
    controller = SimpleNamespace(option=SimpleNamespace(numprocesses=3))
    assert [i.nodeid for i in _collect(controller)] == _SORTED
    plain = SimpleNamespace(option=SimpleNamespace(numprocesses=None))
    assert [i.nodeid for i in _collect(plain)] == _IDS


def test_every_spark_module_is_one_group_and_every_other_module_its_own():
    items = _collect(SimpleNamespace(option=SimpleNamespace(numprocesses=None)))
    groups = {i.nodeid: i.marks[0].args[0] for i in items}      # pytest.mark.xdist_group(name)
    assert groups["tests/spark/test_s.py::t1"] == groups["tests/spark/test_t.py::t1"] == "spark"
    assert groups["tests/unit/test_a.py::t1"] == groups["tests/unit/test_a.py::t2"] == "tests/unit/test_a.py"
    assert groups["tests/integration/test_b.py::t1"] != groups["tests/unit/test_a.py::t1"]


def test_the_addopts_turn_xdists_own_reorder_off():
    import os
    import tomllib
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        addopts = tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--dist loadgroup" in addopts and "--no-loadscope-reorder" in addopts
