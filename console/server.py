"""Serving the console: uvicorn on the caller's asyncio loop (`pocketmq console`, and
`pocketmq dev`, which runs it next to its nameserver and broker in one process)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

log = logging.getLogger("pocketmq.console")


class ConsoleServer:
    """A started console: `url`, `console` (the app's state: its Cluster, sampler) and `close()`."""

    def __init__(self, server, task: asyncio.Task, url: str, console=None):
        self._server = server
        self._task = task
        self.url = url
        self.console = console

    async def close(self) -> None:
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except asyncio.TimeoutError:
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def start_console(namesrv: str, *, bind: str = "127.0.0.1", port: int = 8080, read_only: bool = False,
                        users_file: str | None = None, credentials=None,
                        sample_interval_s: float | None = None) -> ConsoleServer:
    """Build the app and serve it until close(); OSError when the port cannot be bound."""
    import uvicorn

    from pocketmq.console.app import SAMPLE_INTERVAL_S, Console, load_users
    from pocketmq.console.data import Cluster
    users = load_users(users_file) if users_file else None
    console = Console(Cluster(namesrv, credentials=credentials), read_only=read_only, users=users,
                      sample_interval_s=sample_interval_s or SAMPLE_INTERVAL_S)
    # access_log off: a query string may hold a message key or a search text; log_config None:
    # the process's own logging setup stays in charge
    config = uvicorn.Config(console.build(), host=bind, port=port, access_log=False, log_config=None,
                            lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    # the caller owns SIGINT/SIGTERM (uvicorn would take them over while it serves)
    server.capture_signals = contextlib.nullcontext
    # bound here, so a taken port is an OSError naming it (uvicorn would sys.exit), and port 0 works
    sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
    except OSError:
        sock.close()
        raise
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            sock.close()
            try:
                await task
            except SystemExit:
                pass
            raise RuntimeError("the console did not start (see the log above)")
        await asyncio.sleep(0.02)
    host = f"[{bind}]" if ":" in bind else bind
    if bind in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return ConsoleServer(server, task, f"http://{host}:{sock.getsockname()[1]}/", console)
