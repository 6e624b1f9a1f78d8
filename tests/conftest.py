import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

# The README's test command runs two pytest-xdist workers (`-n 2 --dist loadgroup`): one a
# core. These groups decide what stays together: a module's tests on one worker (its
# module-scoped daemons start once), every Spark module on one worker (one JVM, one
# session). The long groups go first, so neither worker is left with one at the end.
_LONG_FIRST = ("tests/spark/", "tests/chaos/", "tests/interop/", "tests/fault/")


def _group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith("tests/spark/") else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group_of(item.nodeid)))
    if getattr(config.option, "numprocesses", None):
        def rank(item):
            path = item.nodeid
            return next((i for i, p in enumerate(_LONG_FIRST) if path.startswith(p)), len(_LONG_FIRST))
        items.sort(key=rank)       # stable: each module keeps its own order
