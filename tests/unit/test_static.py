"""Static tier: pyflakes-class errors (undefined names, unused imports, syntax) fail the suite."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ruff_pyflakes_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]' installs it)")
    p = subprocess.run([ruff, "check", "--select", "F,E9", "--no-cache", str(ROOT)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:]
