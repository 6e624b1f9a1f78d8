import os
import shutil
import sys
import tempfile

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


def _compile_the_project() -> None:
    """Write the bytecode of pocketmq's sources (the folders of pyproject.toml's package-dir)
    and of tests/ into their __pycache__ folders (gitignored), once per run.

    Why: the suite starts ~800 Python processes (brokers, nameservers, mqadmin, the C++ agent,
    Spark's workers), each importing pocketmq. Where PYTHONDONTWRITEBYTECODE is set (this
    project's CI and sandboxes set it) no process ever writes a .pyc, so every one of them
    compiled every module it imports from source: a broker's imports took ~580 ms of CPU
    against ~380 ms with the bytecode written, mqadmin's ~400 against ~200 (docs/testing.md).
    The flag only stops writing: processes read what is there, and recompile a module whose
    source changed. compileall writes whatever the flag says; a folder it cannot write is
    left as it was (its modules then compile as before)."""
    import compileall
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        folders = set(tomllib.load(f)["tool"]["setuptools"]["package-dir"].values())
    for folder in sorted(folders) + ["tests"]:
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=2)


def pytest_configure(config):
    # once, in the process that starts the run (not again in each xdist worker); not in a
    # copy of this file in a scratch project (tests/integration/test_test_order_xdist.py)
    if hasattr(config, "workerinput") or not os.path.exists(os.path.join(ROOT, "tests", "support", "daemons.py")):
        return
    _compile_the_project()
    # the run's port claims, shared by its workers (tests/support/daemons.py free_port)
    from tests.support.daemons import PORT_CLAIMS_ENV
    if not os.environ.get(PORT_CLAIMS_ENV):
        config._pocketmq_port_claims = (PORT_CLAIMS_ENV, tempfile.mkdtemp(prefix="pocketmq-test-ports-"))
        os.environ[PORT_CLAIMS_ENV] = config._pocketmq_port_claims[1]


def pytest_unconfigure(config):
    claims = getattr(config, "_pocketmq_port_claims", None)
    if claims:
        env, folder = claims
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(env, None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group_of(item.nodeid)))
    if _distributed(config):
        def rank(item):
            path = item.nodeid
            return next((i for i, p in enumerate(_LONG_FIRST) if path.startswith(p)), len(_LONG_FIRST))
        items.sort(key=rank)       # stable: each module keeps its own order
