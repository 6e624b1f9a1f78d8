"""The store's layering: the record format has one owner (protocol.message), the reference
model (MemoryStore) imports nothing of the file store it checks, the store stays off the network."""
import ast
import pathlib

STORE = pathlib.Path(__file__).resolve().parents[2] / "broker" / "store"


def _runtime_imports(path: pathlib.Path) -> list[str]:
    """Modules imported by a file, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_memory_store_imports_only_the_store_api_protocol_and_common():
    bad = [m for m in _runtime_imports(STORE / "memory_store.py")
           if m.startswith("pocketmq.") and m != "pocketmq.broker.store.api"
           and not m.startswith(("pocketmq.protocol", "pocketmq.common"))]
    assert not bad, bad


def test_no_record_layout_in_the_store():
    # byte layouts stay with their owners: records in protocol.message, units in
    # consumequeue.py, the checkpoint in checkpoint.py, the IndexFile in index.py
    owners = {"consumequeue.py", "checkpoint.py", "index.py"}
    bad = [p.name for p in STORE.glob("*.py") if p.name not in owners and "struct" in _runtime_imports(p)]
    assert not bad, bad


def test_store_stays_off_the_network():
    for p in STORE.glob("*.py"):
        for m in _runtime_imports(p):
            assert m.split(".")[0] not in {"asyncio", "socket"} and not m.startswith("pocketmq.remoting"), (p.name, m)
