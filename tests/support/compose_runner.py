"""Run docker-compose.yml's services as local processes (Docker does not run in CI).

`ComposeRunner(path).up()` reads the compose file the way ``docker compose``
does (YAML merge keys, ``${VAR:-default}`` interpolation, ``depends_on``
order), then starts each service's ``command`` as a local process with the
service's ``environment``, and waits for its ``healthcheck`` to pass before
starting the services that depend on it (``condition: service_healthy``).
What a container would see is mapped onto this machine:

* only the services of the active profiles run (``profiles=`` or COMPOSE_PROFILES,
  as ``docker compose --profile``): a service without ``profiles`` always, one with
  them when one is active;
* service names resolve to 127.0.0.1; each published (``ports``) or exposed
  (``expose``: reachable from the other services only) container port P of a
  service S listens on a free local port L(S, P) instead;
* an address ``S:P`` (in a command, an environment value, a healthcheck or a
  mounted config file) becomes ``127.0.0.1:L(S, P)``; ``127.0.0.1:P`` and
  ``localhost:P`` inside S's own command or healthcheck mean S's own port;
* a listen port setting ``listenPort=P``, ``haListenPort=P`` or ``metricsPort=P`` (a
  mounted file's line or a ``--listenPort=P`` flag) becomes ``listenPort=L(S, P)``, and so
  does a listen address on every interface, ``0.0.0.0:P`` (etcd's
  ``--listen-client-urls=http://0.0.0.0:2379``), which becomes ``127.0.0.1:L(S, P)``; a
  service that publishes or exposes a port without setting it is refused (the runner
  could not move it);
* ``brokerIP1`` / ``brokerIP2`` set to a service name (how a broker advertises
  itself on the compose network) become 127.0.0.1;
* a named volume becomes a fresh directory, a bind mount of a file a rewritten
  copy of it; a mount's container path is replaced by the local path in
  commands, environment values and mounted files (longest path first);
* the image's programs (mqnamesrv, mqbroker, mqadmin, python, etcd, etcdctl) are the
  ones on this process's PATH (else ``python -m`` the module; etcdctl, when Debian's
  etcd-client is not installed, is a stand-in for ``etcdctl --endpoints=URL endpoint
  health``, the etcd service's healthcheck: it asks the same /health endpoint).

The rewriting is pure (`rewrite_text`, `interpolate`, `Service.local_*`), so
tests can check it without starting anything.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

# Executables of the image that may be missing from PATH (a venv not activated).
_MODULES = {"mqnamesrv": "pocketmq.nameserver", "mqbroker": "pocketmq.broker",
            "mqadmin": "pocketmq.tools.mqadmin", "pocketmq": "pocketmq"}
HOST_KEYS = ("brokerIP1", "brokerIP2")
LOCALHOST = "127.0.0.1"
# a setting of the port a service listens on: `key=P`, `key: P`, or an any-address `0.0.0.0:P`
LISTEN_KEYS = r"(?:listenPort|haListenPort|metricsPort)\s*[=:]\s*|(?<![\w.])0\.0\.0\.0:"


class ComposeError(Exception):
    """The compose file asks for something the runner cannot map, or a service failed."""


# ---------------------------------------------------------------------------
# compose file semantics (pure)

_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: Mapping[str, str]):
    """Compose's variable substitution over every string of a loaded document:
    ``$VAR``, ``${VAR}``, ``${VAR:-default}`` (unset or empty), ``${VAR-default}``
    (unset), ``${VAR:?err}``/``${VAR?err}`` (fail), ``$$`` (a literal ``$``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        current = env.get(name)
        unset_or_empty = current is None or (op is not None and op.startswith(":") and current == "")
        if op and op.endswith("-"):
            return arg if unset_or_empty else current
        if op and op.endswith("?"):
            if unset_or_empty:
                raise ComposeError(f"variable {name} is required: {arg}")
            return current
        return current or ""
    return _VAR.sub(one, value)


def load_compose(path: str, env: Mapping[str, str] | None = None) -> dict:
    """The compose document with merge keys resolved and variables substituted."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    return interpolate(doc, {} if env is None else env)


def _as_list(command) -> list[str]:
    if command is None:
        return []
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    return [str(c) for c in command]


def _environment(spec) -> dict[str, str]:
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return {str(k): "" if v is None else str(v) for k, v in spec.items()}
    out = {}
    for item in spec:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


def _container_port(spec) -> int:
    """The container side of a ports entry: "9877:9876", "9876", "127.0.0.1:9876:9876/tcp", or long syntax."""
    if isinstance(spec, dict):
        return int(spec["target"])
    text = str(spec).split("/")[0]
    return int(text.rsplit(":", 1)[-1])


@dataclass
class Mount:
    source: str          # a named volume's name, or a path relative to the compose file
    target: str          # the path inside the container
    named: bool


def _mounts(spec, project_dir: str) -> list[Mount]:
    out = []
    for item in spec or []:
        if isinstance(item, dict):
            source, target = str(item.get("source", "")), str(item["target"])
            named = item.get("type", "volume") == "volume"
        else:
            parts = str(item).split(":")
            source, target = parts[0], parts[1]
            named = not (source.startswith(".") or source.startswith("/") or source.startswith("~"))
        if not named:
            source = os.path.normpath(os.path.join(project_dir, os.path.expanduser(source)))
        out.append(Mount(source, target, named))
    return out


@dataclass
class Service:
    name: str
    command: list[str]
    environment: dict[str, str]
    ports: list[int]                       # container ports published or exposed
    mounts: list[Mount]
    healthcheck: list[str] | None          # the command, CMD/CMD-SHELL resolved
    depends_on: list[str]
    local_ports: dict[int, int] = field(default_factory=dict)      # container port -> local port
    local_paths: dict[str, str] = field(default_factory=dict)      # container path -> local path


def _healthcheck(spec) -> list[str] | None:
    if not spec or spec.get("disable"):
        return None
    test = spec.get("test")
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    kind, *rest = test
    if kind == "NONE":
        return None
    if kind == "CMD-SHELL":
        return ["/bin/sh", "-c", " ".join(rest)]
    if kind != "CMD":
        raise ComposeError(f"healthcheck test must start with CMD, CMD-SHELL or NONE, not {kind!r}")
    return list(rest)


def active_profiles(profiles, env: Mapping[str, str]) -> set[str]:
    """The profiles given, else COMPOSE_PROFILES (comma-separated), as docker compose reads them."""
    if profiles is None:
        profiles = [p.strip() for p in env.get("COMPOSE_PROFILES", "").split(",")]
    return {p for p in profiles if p}


def services_of(doc: dict, project_dir: str, profiles: set[str] | frozenset = frozenset()) -> dict[str, Service]:
    """The services that run with `profiles` active."""
    out = {}
    for name, spec in doc["services"].items():
        if spec.get("profiles") and not set(spec["profiles"]) & set(profiles):
            continue
        if not spec.get("command"):
            raise ComposeError(f"service {name} has no command (the runner does not read the image's CMD)")
        deps = spec.get("depends_on") or []
        out[name] = Service(name, _as_list(spec["command"]), _environment(spec.get("environment")),
                            [_container_port(p) for p in spec.get("ports") or []]
                            + [int(str(p).split("/")[0]) for p in spec.get("expose") or []],
                            _mounts(spec.get("volumes"), project_dir), _healthcheck(spec.get("healthcheck")),
                            list(deps) if isinstance(deps, list) else list(deps))
    for s in out.values():
        for d in s.depends_on:
            if d not in out:
                what = f"service {d} of an inactive profile" if d in doc["services"] else f"unknown service {d}"
                raise ComposeError(f"service {s.name} depends on {what}")
    return out


def start_order(services: Mapping[str, Service]) -> list[str]:
    """Services in an order where each comes after everything it depends on."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ComposeError(f"dependency cycle through {name}")
        visiting.add(name)
        for d in services[name].depends_on:
            visit(d)
        visiting.discard(name)
        order.append(name)
    for name in services:
        visit(name)
    return order


def rewrite_text(text: str, own: Service, services: Mapping[str, Service]) -> str:
    """A container's text (an argument, an environment value, a mounted file) as seen locally."""
    names = "|".join(re.escape(n) for n in sorted(services, key=len, reverse=True))

    def address(m: re.Match) -> str:
        host, port = m.group("host"), int(m.group("port"))
        target = own if host in (LOCALHOST, "localhost") else services[host]
        if port not in target.local_ports:
            raise ComposeError(f"{own.name}: {m.group(0)} is not a published port of {target.name}")
        return f"{LOCALHOST}:{target.local_ports[port]}"

    def listen(m: re.Match) -> str:
        port = int(m.group("port"))
        if port not in own.local_ports:
            raise ComposeError(f"{own.name}: listen port {port} is not published")
        key = m.group("key")
        if key.startswith("0.0.0.0"):
            return f"{LOCALHOST}:{own.local_ports[port]}"
        return f"{key}{own.local_ports[port]}"

    def host_key(m: re.Match) -> str:
        return f"{m.group('key')}{LOCALHOST}"

    text = re.sub(rf"(?<![\w.-])(?P<host>{names}|127\.0\.0\.1|localhost):(?P<port>\d+)(?!\d)", address, text)
    text = re.sub(rf"(?<!\w)(?P<key>{LISTEN_KEYS})(?P<port>\d+)(?!\d)", listen, text)
    keys = "|".join(HOST_KEYS)
    text = re.sub(rf"(?<!\w)(?P<key>(?:{keys})\s*[=:]\s*)(?:{names})(?![\w.-])", host_key, text)
    for target in sorted(own.local_paths, key=len, reverse=True):
        text = re.sub(rf"{re.escape(target)}(?=/|\b|$)", own.local_paths[target], text)
    return text


def _executable(argv: list[str]) -> list[str]:
    if not argv:
        return argv
    head = argv[0]
    if head in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if "/" not in head and shutil.which(head) is None and head in _MODULES:
        return [sys.executable, "-m", _MODULES[head], *argv[1:]]
    if head == "etcdctl" and shutil.which(head) is None:
        return [sys.executable, os.path.abspath(__file__), "etcdctl", *argv[1:]]
    return argv


def etcdctl_health(args: list[str]) -> int:
    """The stand-in for `etcdctl [--endpoints=URL[,URL]] endpoint health` (etcd-client not
    installed): each endpoint's /health, which etcdctl's check also reads; 0 when all are healthy."""
    if [a for a in args if not a.startswith("--")] != ["endpoint", "health"]:
        print(f"etcdctl stand-in: only 'endpoint health', not {args}", file=sys.stderr)
        return 2
    endpoints = next((a.split("=", 1)[1] for a in args if a.startswith("--endpoints=")), "http://127.0.0.1:2379")
    healthy_all = True
    for url in endpoints.split(","):
        url = url if "://" in url else f"http://{url}"
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=3) as r:
                healthy = json.loads(r.read()).get("health") in ("true", True)
        except (OSError, ValueError):
            healthy = False
        print(f"{url} is {'healthy' if healthy else 'unhealthy'}", file=sys.stdout if healthy else sys.stderr)
        healthy_all = healthy_all and healthy
    return 0 if healthy_all else 1


# ---------------------------------------------------------------------------
# the processes


class ComposeRunner:
    def __init__(self, path: str, workdir: str, *, env: Mapping[str, str] | None = None,
                 profiles=None, health_timeout_s: float = 60.0):
        self.path = os.path.abspath(path)
        self.workdir = workdir
        self.doc = load_compose(self.path, env)
        self.profiles = active_profiles(profiles, os.environ if env is None else env)
        self.services = services_of(self.doc, os.path.dirname(self.path), self.profiles)
        self.health_timeout_s = health_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.commands: dict[str, list[str]] = {}
        declared = set((self.doc.get("volumes") or {}))
        volumes: dict[str, str] = {}
        # daemons' one port rule (below the ephemeral range, never handed out twice: a bind(0)
        # port is ephemeral, and an outgoing connection can take it before the service binds
        # it). Imported here: this file also runs as a script (etcdctl), without `tests`.
        from tests.support.daemons import free_port
        for s in self.services.values():
            for port in s.ports:
                s.local_ports[port] = free_port()
            for m in s.mounts:
                if m.named:
                    if m.source not in declared:
                        raise ComposeError(f"service {s.name} mounts undeclared volume {m.source}")
                    if m.source not in volumes:
                        volumes[m.source] = os.path.join(workdir, "volumes", m.source)
                        os.makedirs(volumes[m.source])
                    s.local_paths[m.target] = volumes[m.source]
                elif os.path.isdir(m.source):
                    s.local_paths[m.target] = m.source
                elif os.path.isfile(m.source):
                    s.local_paths[m.target] = os.path.join(workdir, "mounts", s.name, m.target.lstrip("/"))
                else:
                    raise ComposeError(f"service {s.name}: bind mount source {m.source} does not exist")
        for s in self.services.values():
            self._check_listen_ports(s)

    def _check_listen_ports(self, s: Service) -> None:
        texts = list(s.command)
        texts += [open(m.source).read() for m in s.mounts if not m.named and os.path.isfile(m.source)]
        set_ports = {int(p) for t in texts for p in re.findall(rf"(?<!\w)(?:{LISTEN_KEYS})(\d+)", t)}
        for port in s.ports:
            if port not in set_ports:
                raise ComposeError(f"service {s.name} publishes {port} but sets no listenPort={port}: "
                                   "the runner could not move it to a free local port")

    # -- what a service runs as, locally ----------------------------------------------------
    def address(self, service: str, container_port: int) -> str:
        return f"{LOCALHOST}:{self.services[service].local_ports[container_port]}"

    def local_command(self, name: str) -> list[str]:
        s = self.services[name]
        return _executable([rewrite_text(a, s, self.services) for a in s.command])

    def local_healthcheck(self, name: str) -> list[str] | None:
        s = self.services[name]
        if s.healthcheck is None:
            return None
        return _executable([rewrite_text(a, s, self.services) for a in s.healthcheck])

    def local_env(self, name: str) -> dict[str, str]:
        s = self.services[name]
        env = dict(os.environ)
        env.update({k: rewrite_text(v, s, self.services) for k, v in s.environment.items()})
        return env

    def _materialise_mounts(self, s: Service) -> None:
        for m in s.mounts:
            if m.named or not os.path.isfile(m.source):
                continue
            local = s.local_paths[m.target]
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(m.source) as f:
                text = rewrite_text(f.read(), s, self.services)
            with open(local, "w") as f:
                f.write(text)

    # -- life cycle -------------------------------------------------------------------------
    def up(self) -> "ComposeRunner":
        try:
            for name in start_order(self.services):
                self.start(name)
                self.wait_healthy(name)
        except BaseException:
            self.down()
            raise
        return self

    def start(self, name: str) -> None:
        s = self.services[name]
        self._materialise_mounts(s)
        self.logs[name] = os.path.join(self.workdir, f"{name}.log")
        self.commands[name] = cmd = self.local_command(name)
        with open(self.logs[name], "ab") as log:
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.local_env(name), cwd=self.workdir,
                                                start_new_session=True)

    def run_healthcheck(self, name: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
        cmd = self.local_healthcheck(name)
        if cmd is None:
            raise ComposeError(f"service {name} has no healthcheck")
        return subprocess.run(cmd, env=self.local_env(name), capture_output=True, text=True,
                              timeout=timeout_s, cwd=self.workdir)

    def wait_healthy(self, name: str) -> None:
        """Run the healthcheck until it passes, as compose does for `service_healthy`."""
        deadline = time.monotonic() + self.health_timeout_s
        last = None
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ComposeError(f"service {name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            if self.services[name].healthcheck is None:
                return
            last = self.run_healthcheck(name)
            if last.returncode == 0:
                return
            time.sleep(0.5)     # compose's `interval`, shortened; a check is a request, not an event
        detail = "" if last is None else f"\nlast check: {last.returncode} {last.stdout[-500:]}{last.stderr[-1500:]}"
        raise ComposeError(f"service {name} not healthy in {self.health_timeout_s}s{detail}\n{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs.get(name)
        if not path or not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()[-chars:]

    def stop(self, name: str, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (docker compose stop), then SIGKILL after timeout_s."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(10)

    def down(self) -> None:
        for name in reversed(start_order(self.services)):
            self.stop(name)

    def __enter__(self) -> "ComposeRunner":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


if __name__ == "__main__" and sys.argv[1:2] == ["etcdctl"]:
    sys.exit(etcdctl_health(sys.argv[2:]))
