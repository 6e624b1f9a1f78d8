"""pyproject.toml's package list against the source tree (no build; the wheel itself is
built and installed by tests/integration/test_packaging.py).

The source folders stay at the top of the checkout and install as `pocketmq.<folder>`
through `[tool.setuptools] package-dir`; setuptools ships only the packages listed in
`packages`, so a new folder with an `__init__.py` that is not listed would be silently
missing from the wheel (and work from a checkout only).
"""
from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What may sit at the wheel's top level (pyspark_pocketmq: the Spark connector's discovery shim).
TOP_LEVEL_ALLOWED = {"pocketmq", "pyspark_pocketmq"}


def load_pyproject(root: pathlib.Path = ROOT) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def package_folder(package: str, package_dir: dict[str, str]) -> str:
    """Where setuptools looks for `package`: the longest package-dir key that is a prefix
    of it, then the remaining components as sub-folders."""
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in package_dir:
            return "/".join([package_dir[key].rstrip("/")] + parts[i:])
    if "" in package_dir:
        return "/".join([package_dir[""].rstrip("/")] + parts)
    return "/".join(parts)


def source_packages(root: pathlib.Path, package_dir: dict[str, str]) -> dict[str, str]:
    """Installed name -> folder of every folder with an __init__.py under the mapped folders."""
    out = {}
    for pkg, folder in package_dir.items():
        base = root / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            out[name] = init.parent.relative_to(root).as_posix()
    return out


def _setuptools() -> dict:
    return load_pyproject()["tool"]["setuptools"]


def test_every_source_package_is_listed_with_its_folder():
    st = _setuptools()
    package_dir, listed = st["package-dir"], st["packages"]
    found = source_packages(ROOT, package_dir)
    missing = sorted(set(found) - set(listed))
    assert not missing, f"folders with an __init__.py missing from [tool.setuptools] packages: {missing}"
    for name, folder in found.items():
        assert package_folder(name, package_dir) == folder, (name, folder)


def test_every_listed_package_exists():
    st = _setuptools()
    for name in st["packages"]:
        folder = ROOT / package_folder(name, st["package-dir"])
        assert (folder / "__init__.py").is_file(), f"{name} is listed but {folder}/__init__.py does not exist"
    assert len(set(st["packages"])) == len(st["packages"]), "a package is listed twice"


def test_wheel_top_level_is_only_pocketmq():
    st = _setuptools()
    tops = {name.split(".")[0] for name in list(st["packages"]) + list(st["package-dir"])}
    assert tops <= TOP_LEVEL_ALLOWED, tops
    assert "pocketmq" in tops
    assert not st.get("py-modules"), "top-level modules would land next to pocketmq in site-packages"


def test_console_scripts_point_at_shipped_mains():
    st = _setuptools()
    for script, target in load_pyproject()["project"]["scripts"].items():
        module, _, func = target.partition(":")
        assert module.split(".")[0] in TOP_LEVEL_ALLOWED, (script, target)
        pkg_path = ROOT / package_folder(module, st["package-dir"])
        path = pkg_path / "__init__.py" if pkg_path.is_dir() else pkg_path.with_suffix(".py")
        assert path.is_file(), f"{script}: {module} has no source file ({path})"
        owner = module if path.name == "__init__.py" else module.rpartition(".")[0]
        assert owner in st["packages"], f"{script}: {module} is not in a listed package"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        assert func in names, f"{script}: {module} defines or imports no {func}"


def test_package_folder_resolution():
    pd = {"pocketmq": "pocketmq", "pocketmq.broker": "broker"}
    assert package_folder("pocketmq.broker.store", pd) == "broker/store"
    assert package_folder("pocketmq.broker", pd) == "broker"
    assert package_folder("pocketmq.cli", pd) == "pocketmq/cli"


def test_an_unlisted_folder_is_found(tmp_path):
    # the listing test above is only as good as source_packages' walk
    for d in ("broker", "broker/store", "broker/new", "broker/__pycache__"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "broker" / "data").mkdir()
    found = source_packages(tmp_path, {"pocketmq.broker": "broker"})
    assert found == {"pocketmq.broker": "broker", "pocketmq.broker.new": "broker/new",
                     "pocketmq.broker.store": "broker/store"}


def test_root_package_reexports_every_client_name():
    """`from pocketmq import X` works for every public name of pocketmq.client."""
    import pocketmq
    import pocketmq.client as client
    assert set(client.__all__) == set(pocketmq._CLIENT_NAMES)
    for name in client.__all__:
        assert getattr(pocketmq, name) is getattr(client, name)


def test_jobs_are_shipped_and_run_as_scripts():
    """pocketmq.jobs ships as `jobs/`, and each job also runs as a plain script
    (`spark-submit jobs/ingest.py`): no relative imports (a script has no package), siblings
    imported as pocketmq.jobs.*, and a __main__ guard calling main()."""
    st = _setuptools()
    assert st["package-dir"].get("pocketmq.jobs") == "jobs" and "pocketmq.jobs" in st["packages"]
    for job in ("ingest", "replay"):
        path = ROOT / "jobs" / f"{job}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"jobs/{job}.py:{node.lineno} relative import breaks spark-submit"
                assert not (node.module or "").startswith("jobs"), f"jobs/{job}.py:{node.lineno}: use pocketmq.jobs"
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), job
        guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guards and "main(" in ast.unparse(guards[0]), f"jobs/{job}.py has no __main__ guard calling main()"
