"""Regenerate broker/proxy/pb/ from the .proto files beside this script.

    python3 -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools==1.85.1
    /tmp/gen/bin/python broker/proxy/protos/generate.py

The generated modules are committed (grpcio-tools is a build tool, not a runtime
dependency). The output is rewritten in these ways, each checked:
  * imports between the modules become relative (`from . import definition_pb2`), so the
    modules live at pocketmq.broker.proxy.pb and nowhere else;
  * descriptors go into pocketmq's own descriptor pool (pb/__init__.py POOL), not
    protobuf's default pool: the official RocketMQ 5 client registers the same
    `apache.rocketmq.v2` symbols there, and both must be importable in one process;
  * each module starts with `# ruff: noqa` (generated text, not ours to lint);
  * pb/_source.py records the generator and the SHA-256 of each .proto, which
    tests/unit/test_proxy_protos.py compares with the .proto files (an edit without
    regenerating fails that test).
"""
from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

GENERATOR = "grpcio-tools==1.85.1"
HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "pb"
PROTOS = ("definition.proto", "service.proto")


def _rewrite(path: pathlib.Path, replacements: list[tuple[str, str, int]]) -> None:
    text = path.read_text()
    for old, new, count in replacements:
        found = text.count(old)
        if found != count:
            raise SystemExit(f"{path.name}: expected {count} x {old!r}, found {found} (generator changed?)")
        text = text.replace(old, new)
    path.write_text(text)


def main() -> int:
    from importlib.metadata import version
    if f"grpcio-tools=={version('grpcio-tools')}" != GENERATOR:
        raise SystemExit(f"run with {GENERATOR} (found grpcio-tools {version('grpcio-tools')})")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--python_out={OUT}",
                    f"--grpc_python_out={OUT}", *PROTOS], check=True, cwd=HERE)
    (OUT / "definition_pb2_grpc.py").unlink()     # no services in definition.proto
    pool = ("_descriptor_pool.Default()", "_pocketmq_pool.POOL", 1)
    pool_import = ("from google.protobuf import descriptor_pool as _descriptor_pool\n",
                   "from google.protobuf import descriptor_pool as _descriptor_pool  # noqa: F401\n"
                   "from pocketmq.broker.proxy import pb as _pocketmq_pool\n", 1)
    _rewrite(OUT / "definition_pb2.py", [pool, pool_import])
    _rewrite(OUT / "service_pb2.py", [pool, pool_import, ("import definition_pb2 as",
                                                          "from . import definition_pb2 as", 1)])
    _rewrite(OUT / "service_pb2_grpc.py", [("import service_pb2 as", "from . import service_pb2 as", 1)])
    for name in ("definition_pb2.py", "service_pb2.py", "service_pb2_grpc.py"):
        path = OUT / name     # generated text: the linters' rules are for code written here
        path.write_text("# ruff: noqa\n" + path.read_text())
    digests = {p: hashlib.sha256((HERE / p).read_bytes()).hexdigest() for p in PROTOS}
    (OUT / "_source.py").write_text(
        '"""Written by broker/proxy/protos/generate.py: what the modules beside it were generated from."""\n'
        f"GENERATOR = {GENERATOR!r}\nPROTO_SHA256 = {{\n"
        + "".join(f"    {name!r}: {digest!r},\n" for name, digest in digests.items()) + "}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
