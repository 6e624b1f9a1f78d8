"""The official RocketMQ 5.x Node.js client (rocketmq-client-nodejs), installed with npm into
a cache dir of its own, ~/.cache/pocketmq/node-rmq5-<version> (POCKETMQ_NODE_RMQ5_DIR
overrides it), once per machine (tests/support/rmq5.py's build_once: a lock, marked ready
only once `require('rocketmq-client-nodejs')` works). Tests that need it are skipped, with
npm's own words as the reason, when node or npm is missing or the install fails.

`run_node_driver(node_dir, endpoint, scenario, **args)` runs tests/support/node_rmq5_driver.js
with that install on NODE_PATH and returns the JSON events it printed.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import pytest

from tests.support.rmq5 import Unavailable, build_once, cache_dir, run_events

NODE_RMQ5_VERSION = "1.0.8"
DRIVER = pathlib.Path(__file__).with_name("node_rmq5_driver.js")


def install_dir() -> pathlib.Path:
    return cache_dir("POCKETMQ_NODE_RMQ5_DIR", f"node-rmq5-{NODE_RMQ5_VERSION}")


def ensure_install(timeout_s: float = 600) -> pathlib.Path:
    """The install dir (its node_modules holds the client). Raises Unavailable."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise Unavailable("node and npm are not on PATH")
    d = install_dir()
    build_once(d, [["mkdir", "-p", str(d)],
                   [npm, "install", "--prefix", str(d), "--no-audit", "--no-fund", "--no-save", "--loglevel=error",
                    f"rocketmq-client-nodejs@{NODE_RMQ5_VERSION}"],
                   [node, "-e", f"require({json.dumps(str(d / 'node_modules' / 'rocketmq-client-nodejs'))})"]],
               NODE_RMQ5_VERSION, timeout_s)
    return d


@pytest.fixture(scope="session", name="node_rmq5")
def node_rmq5_fixture() -> pathlib.Path:
    """The install dir of rocketmq-client-nodejs NODE_RMQ5_VERSION (skips when it cannot be made)."""
    try:
        return ensure_install()
    except Unavailable as e:
        if os.environ.get("POCKETMQ_REQUIRE_RMQ5"):
            raise
        pytest.skip(f"rocketmq-client-nodejs {NODE_RMQ5_VERSION} cannot be installed here: {e}")


def run_node_driver(node_dir: pathlib.Path, endpoint: str, scenario: str, timeout_s: float = 60,
                    **args) -> list[dict]:
    """Run one driver scenario; its JSON events. A non-zero exit or a timeout fails with the
    driver's stderr tail."""
    # the client writes its logs under ~/logs; removed afterwards (the stderr tail is in the error)
    with tempfile.TemporaryDirectory(prefix="noderm5home") as home:
        env = dict(os.environ, NODE_PATH=str(node_dir / "node_modules"), HOME=home)
        return run_events([shutil.which("node") or "node", str(DRIVER), endpoint, scenario, json.dumps(args)], env,
                          home, f"node driver {scenario}", timeout_s)
