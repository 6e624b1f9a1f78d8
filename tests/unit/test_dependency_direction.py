"""The layering of the preamble/architecture.md, checked by walking every module's imports.

Every `import` and `from ... import` is read with ast (also inside functions and
`if TYPE_CHECKING:` blocks: a static dependency is a dependency). Relative imports are
resolved against the importing module's package, `from X import name` counts as an
import of `X.name` (name may be a submodule), and each import is mapped to the layer
that owns it:

    protocol      pure: nothing of ours; no asyncio/socket/time/os/threading/uvloop/selectors
    common        protocol; like protocol but os/tempfile are allowed (common/files.py)
    remoting      protocol, common
    broker.store  protocol, common, broker.store.api; no asyncio/socket/uvloop/selectors, no remoting
    broker.store.api  the store's contract (statuses, request/result tuples): protocol, common; pure
    broker.core   protocol, common, broker.store.api (store statuses are inputs of its rules);
                  pure: no asyncio/socket/time/threading/os/uvloop/selectors
    broker        protocol, common, remoting, broker.store, broker.core
    nameserver    protocol, common, remoting
    client        protocol, common, remoting
    tools         client, protocol, common, remoting
    spark         client, protocol, common, remoting (the PySpark connector; nothing imports it
                  but the root and the discovery shim)
    pyspark_pocketmq  spark only (the top-level shim Spark discovers)
    jobs          spark, client, protocol, common, remoting (the Spark jobs; nothing imports them,
                  not even the root)
    console       tools, client, protocol, common, remoting (the web console: it talks to the
                  cluster through mqadmin's AdminSession over the client's ClientAPI; only the
                  root's cli imports it)
    pocketmq      anything (the import root: cli, lazy re-exports)

Siblings (broker, nameserver, client, tools) never import each other except tools ->
client. Separately, no file of the product, tests or bench may import one of the old
top-level names (`import client`, `from protocol.x import y`) or run one as a module
(`[sys.executable, "-m", "nameserver"]`): those resolve only from a checkout's cwd and
would load a second copy of a module next to `pocketmq.<pkg>`. `jobs` is the one folder run
by its bare name (`python -m jobs.ingest` from the checkout is its documented use; the job
modules import `pocketmq.*` only), so only importing it bare is refused.
"""
from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# source folder -> installed package (must equal pyproject's package-dir; asserted below)
FOLDERS = {
    "pocketmq": "pocketmq",
    "protocol": "pocketmq.protocol",
    "common": "pocketmq.common",
    "remoting": "pocketmq.remoting",
    "broker": "pocketmq.broker",
    "nameserver": "pocketmq.nameserver",
    "client": "pocketmq.client",
    "tools": "pocketmq.tools",
    "spark": "pocketmq.spark",
    "pyspark_pocketmq": "pyspark_pocketmq",
    "jobs": "pocketmq.jobs",
    "console": "pocketmq.console",
}
SHIM = "pyspark_pocketmq"   # the one top-level name besides pocketmq; a layer of its own
# sub-layers: an installed package prefix that is a layer of its own
# (longest prefix first: broker.store.api is a layer inside broker.store)
SUBLAYERS = {"pocketmq.broker.store.api": "broker.store.api", "pocketmq.broker.store": "broker.store",
             "pocketmq.broker.core": "broker.core"}

ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "common": {"protocol"},
    "remoting": {"protocol", "common"},
    "broker.store.api": {"protocol", "common"},
    "broker.store": {"protocol", "common", "broker.store.api"},
    "broker.core": {"protocol", "common", "broker.store.api"},
    "broker": {"protocol", "common", "remoting", "broker.store", "broker.store.api", "broker.core"},
    "nameserver": {"protocol", "common", "remoting"},
    "client": {"protocol", "common", "remoting"},
    "tools": {"client", "protocol", "common", "remoting"},
    "spark": {"client", "protocol", "common", "remoting"},
    SHIM: {"spark"},
    "jobs": {"spark", "client", "protocol", "common", "remoting"},
    "console": {"tools", "client", "protocol", "common", "remoting"},
}
LEAVES = {"jobs"}          # layers nothing else may import (the root included)
TOP = "pocketmq"           # the import root's own modules may import every layer

_NET = {"asyncio", "socket", "uvloop", "selectors"}
FORBIDDEN_STDLIB: dict[str, set[str]] = {
    "protocol": _NET | {"time", "os", "threading"},
    "common": _NET | {"time", "threading"},
    "broker.core": _NET | {"time", "threading", "os"},
    "broker.store": _NET,
    "broker.store.api": _NET | {"time", "threading", "os"},
}

# The names the source folders had before they were installed under `pocketmq.`.
OLD_TOP_LEVEL = {"protocol", "common", "remoting", "broker", "nameserver", "client", "tools", "pocketmq_cli"}
# Names that may not be imported bare (but `jobs` may be run with -m: see the docstring).
BARE_IMPORTS = OLD_TOP_LEVEL | {"jobs"}
# Where the bare-name rule applies besides the product folders.
EXTRA_TREES = ("tests", "bench")


# --------------------------------------------------------------------------- the checker

def module_name(root: pathlib.Path, path: pathlib.Path, folders: dict[str, str]) -> str | None:
    """Installed dotted name of a product file, None outside the mapped folders."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[0] not in folders:
        return None
    dotted = folders[parts[0]].split(".") + parts[1:]
    if dotted[-1] == "__init__":
        dotted.pop()
    return ".".join(dotted)


def layer_of(dotted: str) -> str | None:
    """The layer owning a dotted module (or module.attribute) name; None if not ours."""
    for prefix, layer in SUBLAYERS.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return layer
    parts = dotted.split(".")
    if parts[0] == SHIM:
        return SHIM
    if parts[0] != "pocketmq":
        return None
    if len(parts) > 1 and "pocketmq." + parts[1] in FOLDERS.values():
        return parts[1]
    return TOP


def imports(path: pathlib.Path, module: str | None):
    """(dotted name, line, is_relative) for every import in the file. Relative imports are
    resolved against `module`'s package; `from X import a` yields X.a (a may be a module)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno, False
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                if module is None:
                    yield f"{'.' * node.level}{node.module or ''} (unresolvable relative import)", node.lineno, True
                    continue
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                keep = len(pkg) - (node.level - 1)
                if keep <= 0:
                    yield f"{'.' * node.level}{node.module or ''} (beyond the top package)", node.lineno, True
                    continue
                base = ".".join(pkg[:keep] + ([node.module] if node.module else []))
            for a in node.names:
                if a.name == "*":
                    yield base, node.lineno, node.level > 0
                else:
                    yield f"{base}.{a.name}" if base else a.name, node.lineno, node.level > 0


def module_runs(path: pathlib.Path):
    """(module, line) of every `"-m", "<module>"` pair of string constants in a call's
    arguments or a list/tuple display: `python -m client.x` from a checkout's cwd is a
    bare import too."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        items = node.args if isinstance(node, ast.Call) else node.elts if isinstance(node, (ast.List, ast.Tuple)) \
            else None
        if not items:
            continue
        for a, b in zip(items, items[1:]):
            if isinstance(a, ast.Constant) and a.value == "-m" and isinstance(b, ast.Constant) \
                    and isinstance(b.value, str):
                yield b.value, b.lineno


def _product_files(root: pathlib.Path, folders: dict[str, str]):
    for folder in folders:
        base = root / folder
        if base.is_dir():
            yield from sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def check(root: pathlib.Path, folders: dict[str, str] = FOLDERS,
          extra_trees: tuple[str, ...] = EXTRA_TREES) -> list[str]:
    """Every violation as 'file:line (layer) imports NAME: why'."""
    problems = []
    for path in _product_files(root, folders):
        rel = path.relative_to(root)
        module = module_name(root, path, folders)
        own = layer_of(module)
        for name, line, relative in imports(path, module):
            where = f"{rel}:{line} ({own})"
            how = "relatively " if relative else ""
            if name.endswith(")"):          # unresolvable relative import
                problems.append(f"{where} imports {name}")
                continue
            first = name.split(".")[0]
            if not relative and first in BARE_IMPORTS:
                problems.append(f"{where} imports {name}: bare old top-level name, use pocketmq.{name}")
                continue
            if first in FORBIDDEN_STDLIB.get(own, ()):
                problems.append(f"{where} imports {name}: {own} must not use {first}")
                continue
            target = layer_of(name)
            if target in LEAVES and target != own:
                problems.append(f"{where} {how}imports {name}: nothing may import {target}")
                continue
            if target is None or target == own or own == TOP:
                continue
            if target not in ALLOWED[own]:
                problems.append(f"{where} {how}imports {name}: {own} may not depend on {target}")
    for tree in extra_trees:
        base = root / tree
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            for name, line, relative in imports(path, None):
                if not relative and name.split(".")[0] in BARE_IMPORTS:
                    problems.append(f"{path.relative_to(root)}:{line} imports {name}: bare old top-level name, "
                                    f"use pocketmq.{name}")
    return problems


def check_module_runs(root: pathlib.Path, folders: dict[str, str] = FOLDERS,
                      extra_trees: tuple[str, ...] = EXTRA_TREES) -> list[str]:
    """Every `-m <old top-level name>` as 'file:line runs -m NAME: why'."""
    paths = list(_product_files(root, folders))
    for tree in extra_trees:
        if (root / tree).is_dir():
            paths += sorted((root / tree).rglob("*.py"))
    return [f"{path.relative_to(root)}:{line} runs -m {name}: bare old top-level name, use -m pocketmq.{name}"
            for path in paths for name, line in sorted(module_runs(path), key=lambda r: r[1])
            if name.split(".")[0] in OLD_TOP_LEVEL]


# --------------------------------------------------------------------------- the real tree

def test_folders_match_pyproject_package_dir():
    """A source folder the checker does not know would escape every rule."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    assert {folder: pkg for pkg, folder in package_dir.items()} == FOLDERS


def test_every_product_module_is_checked():
    # the walk covers each mapped folder (a typo in FOLDERS or a moved tree would check nothing)
    seen = {path.relative_to(ROOT).parts[0] for path in _product_files(ROOT, FOLDERS)}
    assert seen == set(FOLDERS)


def test_dependency_direction():
    problems = check(ROOT)
    assert not problems, f"{len(problems)} layering violations:\n" + "\n".join(problems)


def test_no_subprocess_runs_an_old_top_level_name():
    problems = check_module_runs(ROOT)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the checker itself

FAKE_TREE = {
    # (path, source, expected fragment of the one violation it causes or None)
    "protocol/__init__.py": ("", None),
    "protocol/codec.py": ("import json\nimport time\n", "protocol/codec.py:2 (protocol) imports time"),
    "protocol/headers/__init__.py": ("", None),
    "protocol/headers/x.py": ("from .. import codec\nfrom ...remoting import conn\n",
                              "protocol/headers/x.py:2 (protocol) relatively imports pocketmq.remoting.conn"),
    "common/__init__.py": ("", None),
    "common/files.py": ("import os\nimport tempfile\n\ndef f():\n    import threading\n",
                        "common/files.py:5 (common) imports threading"),
    "remoting/__init__.py": ("", None),
    "remoting/conn.py": ("import asyncio\nfrom pocketmq.protocol import codec\n"
                         "from pocketmq.broker.store import log\n",
                         "remoting/conn.py:3 (remoting) imports pocketmq.broker.store.log"),
    "broker/__init__.py": ("", None),
    "broker/app.py": ("from .store import log\nfrom .core import rules\nfrom pocketmq.remoting import conn\n"
                      "from pocketmq.nameserver import route\n",
                      "broker/app.py:4 (broker) imports pocketmq.nameserver.route: broker may not depend on "
                      "nameserver"),
    "broker/store/__init__.py": ("", None),
    "broker/store/log.py": ("import os\nimport time\nfrom ..app import x\n",
                            "broker/store/log.py:3 (broker.store) relatively imports pocketmq.broker.app.x"),
    "broker/store/net.py": ("from pocketmq.remoting.conn import Conn\n",
                            "broker/store/net.py:1 (broker.store) imports pocketmq.remoting.conn.Conn"),
    "broker/store/poll.py": ("import selectors\n", "broker/store/poll.py:1 (broker.store) imports selectors"),
    "broker/core/__init__.py": ("", None),
    "broker/core/rules.py": ("from time import monotonic\n",
                             "broker/core/rules.py:1 (broker.core) imports time.monotonic"),
    "broker/core/more.py": ("def f():\n    from . import rules\n    from ..store import log\n",
                            "broker/core/more.py:3 (broker.core) relatively imports pocketmq.broker.store.log"),
    "nameserver/__init__.py": ("", None),
    "nameserver/route.py": ("from pocketmq.client import Producer\n",
                            "nameserver/route.py:1 (nameserver) imports pocketmq.client.Producer"),
    "client/__init__.py": ("", None),
    "client/p.py": ("from pocketmq import tools\n", "client/p.py:1 (client) imports pocketmq.tools"),
    "client/q.py": ("import client.message\n", "client/q.py:1 (client) imports client.message: bare old"),
    "tools/__init__.py": ("", None),
    "tools/admin.py": ("from pocketmq.client import Producer\nfrom pocketmq.broker import app\n",
                       "tools/admin.py:2 (tools) imports pocketmq.broker.app"),
    "spark/__init__.py": ("from pocketmq.client import Producer\nfrom . import source\n", None),
    "spark/source.py": ("from pocketmq.broker import app\n",
                        "spark/source.py:1 (spark) imports pocketmq.broker.app: spark may not depend on broker"),
    "tools/spark_job.py": ("from pocketmq.spark import source\n",
                           "tools/spark_job.py:1 (tools) imports pocketmq.spark.source: tools may not depend on spark"),
    "pyspark_pocketmq/__init__.py": ("from pocketmq.spark import source\nfrom pocketmq.client import x\n",
                                     "pyspark_pocketmq/__init__.py:2 (pyspark_pocketmq) imports pocketmq.client.x"),
    "jobs/__init__.py": ("", None),
    "jobs/ingest.py": ("from pocketmq.spark import source\nfrom pocketmq.client import Message\n"
                       "from pocketmq.broker import app\n",
                       "jobs/ingest.py:3 (jobs) imports pocketmq.broker.app: jobs may not depend on broker"),
    "jobs/replay.py": ("from . import ingest\nfrom pocketmq.jobs import ingest as i\n", None),
    "spark/plan.py": ("from pocketmq.jobs import ingest\n",
                      "spark/plan.py:1 (spark) imports pocketmq.jobs.ingest: nothing may import jobs"),
    "pocketmq/jobs_cli.py": ("def f():\n    from pocketmq.jobs import replay\n",
                             "pocketmq/jobs_cli.py:2 (pocketmq) imports pocketmq.jobs.replay: nothing may import jobs"),
    "console/__init__.py": ("", None),
    "console/app.py": ("from pocketmq.tools.mqadmin import session\nfrom pocketmq.broker import app\n",
                       "console/app.py:2 (console) imports pocketmq.broker.app: console may not depend on broker"),
    "tools/web.py": ("from pocketmq.console import app\n",
                     "tools/web.py:1 (tools) imports pocketmq.console.app: tools may not depend on console"),
    "pocketmq/__init__.py": ("from pocketmq import client\n", None),
    "pocketmq/cli.py": ("from pocketmq.broker import app\nfrom pocketmq.nameserver import route\n"
                        "from .tools import admin\n", None),
    "tests/test_x.py": ("import pytest\nfrom tests.support import y\nfrom protocol.codec import f\n",
                        "tests/test_x.py:3 imports protocol.codec.f: bare old"),
    "bench/b.py": ("def f():\n    import broker.store\n", "bench/b.py:2 imports broker.store: bare old"),
    "tests/test_j.py": ("import subprocess\nsubprocess.run(['python', '-m', 'jobs.ingest'])\nimport jobs.ingest\n",
                        "tests/test_j.py:3 imports jobs.ingest: bare old"),
}


def test_checker_catches_each_kind_of_violation(tmp_path):
    for rel, (source, _) in FAKE_TREE.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(source)
    problems = check(tmp_path)
    expected = [want for _, want in FAKE_TREE.values() if want]
    for want in expected:
        assert sum(p.startswith(want) for p in problems) == 1, (want, problems)
    # and nothing else: every allowed import above (pocketmq -> anything, tools -> client,
    # broker -> store/core/remoting, relative imports inside a layer, os in common/store) passes
    assert len(problems) == len(expected), problems


def test_checker_catches_module_runs_of_old_names(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cli.py").write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'pocketmq.broker'])\n"
        "subprocess.run([sys.executable, '-m', 'client.admin_cli', 'help'])\n"
        "create_subprocess_exec(sys.executable, '-m',\n    'nameserver', '--listenPort=0')\n"
        "parse_args(['-m', '--brokerName=b1'])\n"
        "subprocess.run([sys.executable, '-m', 'jobs.ingest'])\n")   # jobs' documented run, allowed
    assert check_module_runs(tmp_path) == [
        "tests/test_cli.py:3 runs -m client.admin_cli: bare old top-level name, use -m pocketmq.client.admin_cli",
        "tests/test_cli.py:5 runs -m nameserver: bare old top-level name, use -m pocketmq.nameserver"]


def test_relative_imports_resolve_against_the_package(tmp_path):
    p = tmp_path / "broker" / "store" / "__init__.py"
    p.parent.mkdir(parents=True)
    p.write_text("from . import log\nfrom ..core import rules\nfrom .. import app\n")
    got = [(n, rel) for n, _, rel in imports(p, module_name(tmp_path, p, FOLDERS))]
    assert got == [("pocketmq.broker.store.log", True), ("pocketmq.broker.core.rules", True),
                   ("pocketmq.broker.app", True)]
    assert [layer_of(n) for n, _ in got] == ["broker.store", "broker.core", "broker"]
