"""Every ```python block of the README runs against a real nameserver + broker."""
import os
import re
import subprocess
import sys

import pytest

from tests.support.daemons import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("readme"))).start()
    yield c
    c.stop()


def test_readme_has_client_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("idx", range(len(BLOCKS)))
def test_readme_example_runs(cluster, idx, tmp_path):
    code = BLOCKS[idx].replace("127.0.0.1:9876", cluster.namesrv_addr)
    code = code.replace("asyncio.sleep(60)", "asyncio.sleep(2)")
    # A hang shows where it is stuck instead of only timing out.
    code = "import faulthandler; faulthandler.dump_traceback_later(40, exit=True)\n" + code
    # Run outside the checkout, as a user's script would: only the installed `pocketmq`
    # package is importable there (the checkout's top-level source folders are not).
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"README example {idx} failed:\n{code}\n--- stderr ---\n{p.stderr[-3000:]}"
