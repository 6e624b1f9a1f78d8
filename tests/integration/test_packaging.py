"""Build the wheel, install it into a fresh venv (no system site-packages, no checkout on
sys.path) and import from there: proves the installed layout is one `pocketmq` root and
that no module depends on running from a checkout.

The build uses pip's build isolation (pyproject requires setuptools>=68, newer than
the one the test venvs carry), so it needs a package index; the sources are copied to
tmp_path first so the build leaves no build/ or egg-info behind in the checkout.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.unit.test_packaging import TOP_LEVEL_ALLOWED, load_pyproject

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
OLD_TOP_LEVEL = ("protocol", "common", "remoting", "broker", "nameserver", "client", "tools")


def _run(args, timeout_s, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False, **kw)


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    project = load_pyproject()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in project["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    for f in ("pyproject.toml", project["project"].get("readme", "README.md")):
        shutil.copy2(ROOT / f, src / f)
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(src)], 120)
    assert p.returncode == 0, f"wheel build failed (needs setuptools>=68 from an index):\n{p.stdout}\n{p.stderr}"
    wheels = list((tmp / "dist").glob("pocketmq-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_only_the_pocketmq_root(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1, tops
    assert tops - dist_info <= TOP_LEVEL_ALLOWED, sorted(tops)
    # every listed package made it in, and nothing of the test tooling did
    for pkg in load_pyproject()["tool"]["setuptools"]["packages"]:
        assert pkg.replace(".", "/") + "/__init__.py" in names, pkg
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/") or "/bench/" in n]
    # the console's package data: templates, its own and the vendored static files, licenses
    for f in ("templates/base.html", "static/console.js", "static/favicon.svg", "static/vendor/htmx.min.js",
              "static/vendor/htmx.LICENSE", "static/vendor/uPlot.iife.min.js", "static/vendor/uPlot.LICENSE"):
        assert "pocketmq/console/" + f in names, f


def test_installed_wheel_imports_from_pocketmq_only(wheel, tmp_path):
    venv = tmp_path / "venv"
    p = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 60)
    assert p.returncode == 0, p.stderr
    py = venv / "bin" / "python"
    env = _clean_env()

    # 1. The wheel alone: the root imports (its client names load lazily) and the old
    #    top-level names do not exist, run from a cwd that is not a checkout.
    p = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], 120)
    assert p.returncode == 0, p.stdout + p.stderr
    probe = textwrap.dedent(f"""
        import importlib, sys
        import pocketmq
        assert pocketmq.__file__.startswith({str(venv)!r}), pocketmq.__file__
        for name in {OLD_TOP_LEVEL!r}:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                continue
            sys.exit("import " + name + " worked: " + str(sys.modules[name]))
        print("ok")
    """)
    p = _run([str(py), "-c", probe], 60, cwd=tmp_path, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr

    # 2. With its declared dependencies: every module of the wheel imports (none needs the
    #    checkout or the test tooling) and every console script's target exists.
    p = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", str(wheel)], 180)
    if p.returncode != 0:
        pytest.skip(f"cannot install the wheel's dependencies here: {p.stderr.strip().splitlines()[-1:]}")
    probe = textwrap.dedent("""
        import importlib, importlib.metadata as md, importlib.util, pkgutil, sys
        import pocketmq
        # pocketmq.spark needs the `spark` extra (pyspark, pyarrow), pocketmq.console the
        # `console` extra (starlette, jinja2, uvicorn), not installed here
        mods = [m.name for m in pkgutil.walk_packages(pocketmq.__path__, "pocketmq.")
                if not m.name.endswith("__main__")
                and (importlib.util.find_spec("pyspark") or not m.name.startswith("pocketmq.spark"))
                and (importlib.util.find_spec("starlette") or not m.name.startswith("pocketmq.console"))]
        for name in mods:
            importlib.import_module(name)
        for ep in md.entry_points(group="console_scripts"):
            if ep.dist.name == "pocketmq":
                assert callable(ep.load()), ep
        assert "client" not in sys.modules and "protocol" not in sys.modules
        print(len(mods))
    """)
    p = _run([str(py), "-c", probe], 60, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert int(p.stdout.strip()) > 50, p.stdout
    p = _run([str(venv / "bin" / "mqadmin"), "help"], 60, cwd=tmp_path, env=env)
    assert p.returncode == 0 and "updateTopic" in p.stdout, p.stdout + p.stderr
