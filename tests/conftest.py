import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

# The README's test command runs pytest-xdist workers (`-n 3 --dist loadgroup
# --no-loadscope-reorder`). These groups decide what stays together: a module's tests on one
# worker (its module-scoped daemons start once), every Spark module on one worker (one JVM,
# one session). The groups are handed out in the order sorted here: the long tiers first,
# the unit tests (many short modules) last, so they fill in while the last long group ends.
# xdist's own reorder (by the number of tests in a group) is off: it sent the long tiers
# last. The sort runs where the scheduler's collection comes from, the workers, whose
# options xdist resets (numprocesses None there, `workerinput` set).
_LONG_FIRST = ("tests/spark/", "tests/chaos/", "tests/interop/", "tests/fault/", "tests/integration/")


def _group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith("tests/spark/") else path


def _distributed(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group_of(item.nodeid)))
    if _distributed(config):
        def rank(item):
            path = item.nodeid
            return next((i for i, p in enumerate(_LONG_FIRST) if path.startswith(p)), len(_LONG_FIRST))
        items.sort(key=rank)       # stable: each module keeps its own order
