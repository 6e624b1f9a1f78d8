"""A transport for a remoting Connection that writes nowhere: server-side code paths
without sockets (unit tests, bench_broker.py --in-process)."""
from __future__ import annotations


class NullTransport:
    """What Connection asks of an asyncio transport; writes are counted, not kept."""

    def __init__(self, peer: tuple[str, int] | None = None):
        self.peer = peer
        self.writes = 0

    def get_extra_info(self, key):
        return self.peer if key == "peername" else None

    def writelines(self, parts):
        self.writes += 1

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def close(self):
        pass
