"""RemotingServer.close_idle: the one idle-connection closer (broker and nameserver), on an integer clock."""
from pocketmq.remoting.connection import Connection
from pocketmq.remoting.server import RemotingServer


class _Conn(Connection):
    def __init__(self):
        super().__init__()
        self.remote_addr = "10.0.0.1:4242"
        self.close_calls = 0

    def close(self):
        self.close_calls += 1

    def read(self):
        # What data_received stamps on every read (without a transport to read from).
        self.last_read_s += 1.0


def _server_with(*conns):
    server = RemotingServer({})
    server.connections.update(conns)
    return server


def test_quiet_connection_closed_idle_s_after_the_tick_that_last_saw_it_read():
    conn = _Conn()
    server = _server_with(conn)
    assert server.close_idle(120, now_ms=1_000_000) == 0   # first sight: active from this tick
    assert server.close_idle(120, now_ms=1_119_999) == 0
    assert conn.close_calls == 0
    assert server.close_idle(120, now_ms=1_120_000) == 1
    assert conn.close_calls == 1


def test_a_read_between_ticks_restarts_the_count_at_the_next_tick():
    conn = _Conn()
    server = _server_with(conn)
    server.close_idle(120, now_ms=0)
    conn.read()
    assert server.close_idle(120, now_ms=100_000) == 0     # saw the read: active at 100 s
    assert server.close_idle(120, now_ms=219_999) == 0
    assert server.close_idle(120, now_ms=220_000) == 1


def test_only_the_quiet_connection_is_closed():
    quiet, busy = _Conn(), _Conn()
    server = _server_with(quiet, busy)
    for now in range(0, 130_000, 10_000):
        busy.read()
        server.close_idle(120, now_ms=now)
    assert quiet.close_calls == 1 and busy.close_calls == 0
