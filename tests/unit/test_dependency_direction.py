"""The layering of architecture.md, checked by walking every module's imports."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# package -> top-level packages it may import (besides itself and the stdlib/third party)
ALLOWED = {
    "protocol": set(),
    "remoting": {"protocol"},
    "broker.store": {"protocol"},
    "broker": {"protocol", "remoting", "broker.store"},
    "nameserver": {"protocol", "remoting"},
    "client": {"protocol", "remoting"},
}
OURS = {"protocol", "remoting", "broker", "nameserver", "client", "jobs", "pocketmq_cli"}
# Pure packages must not touch the outside world.
PURE_FORBIDDEN = {"protocol": {"asyncio", "socket", "time", "os", "threading", "uvloop"}}


def _package_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts
    if parts[:2] == ("broker", "store"):
        return "broker.store"
    return parts[0]


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    if parts[:2] == ["broker", "store"]:
        return "broker.store"
    return parts[0]


def test_dependency_direction():
    problems = []
    for pkg in ALLOWED:
        base = ROOT / pkg.replace(".", "/")
        for path in base.rglob("*.py"):
            own = _package_of(path)
            if own != pkg:
                continue
            for module, line in _imports(path):
                tgt = _target(module)
                if tgt is None or tgt == own:
                    continue
                if tgt not in ALLOWED[own]:
                    problems.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {module}")
                if own == "broker.store" and tgt == "broker":
                    problems.append(f"{path.relative_to(ROOT)}:{line} store imports the broker")
            for module, line in _imports(path):
                if module.split(".")[0] in PURE_FORBIDDEN.get(own, ()):
                    problems.append(f"{path.relative_to(ROOT)}:{line} pure package {own} imports {module}")
    assert not problems, "\n".join(problems)
