"""The console's sans-IO rules (console/logic.py, console/auth.py): lag, lag history, the
reset preview, scan bounds, pagination, the cache, body views, users file, sessions, CSRF."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the console extra is not installed")

from pocketmq.console import auth, logic  # noqa: E402

# -- lag ----------------------------------------------------------------------------------------


def test_lag_is_never_negative_and_unknown_without_an_offset():
    assert logic.queue_lag(100, 40) == 60
    assert logic.queue_lag(100, 100) == 0
    assert logic.queue_lag(10, 25) == 0           # consumer past the broker (a reset, a truncation)
    assert logic.queue_lag(100, None) is None      # no committed offset: unknown, not -1
    assert logic.queue_lag(100, -1) is None        # the broker's "not found"
    assert logic.lag_text(None) == "no offset yet" and logic.lag_text(0) == "0"


def test_total_lag_sums_known_queues_only():
    assert logic.total_lag([5, None, 7]) == 12
    assert logic.total_lag([None, None]) is None
    assert logic.total_lag([]) is None
    assert logic.total_lag([0, None]) == 0


def test_groups_sorted_by_lag_unknown_last():
    rows = [("a", None), ("b", 3), ("c", 50), ("d", 0)]
    assert [r[0] for r in logic.sort_groups_by_lag(rows, lambda r: r[1])] == ["c", "b", "d", "a"]


def test_lag_history_window_points_and_groups_are_bounded():
    h = logic.LagHistory(window_ms=10_000, max_points=3, max_groups=2)
    for t in range(5):
        h.add("g1", 1000 * t, t)
    assert h.series("g1", 4000) == [(2000, 2), (3000, 3), (4000, 4)]      # max_points
    assert h.series("g1", 13_500) == [(4000, 4)]                          # older than the window
    h.add("g2", 5000, None)
    h.add("g3", 5000, 1)                   # a third group forgets the least recently sampled
    assert h.groups() == ["g2", "g3"]
    assert h.series("g1", 5000) == []
    assert logic.chart_data([(1000, 5), (2000, None)]) == {"x": [1.0, 2.0], "lag": [5, None]}
    with pytest.raises(ValueError):
        logic.LagHistory(window_ms=0)


# -- reset preview ------------------------------------------------------------------------------


def test_reset_timestamps_per_mode():
    assert logic.reset_timestamp_ms("earliest", None) == 0
    assert logic.reset_timestamp_ms("latest", 123) == -1
    assert logic.reset_timestamp_ms("time", 1_700_000_000_000) == 1_700_000_000_000
    with pytest.raises(ValueError, match="needs a time"):
        logic.reset_timestamp_ms("time", None)
    with pytest.raises(ValueError, match="unknown reset mode"):
        logic.reset_timestamp_ms("sideways", 1)


def test_reset_targets_are_clamped_into_the_queue():
    assert logic.reset_target("earliest", 10, 90, None) == 10
    assert logic.reset_target("latest", 10, 90, None) == 90
    assert logic.reset_target("time", 10, 90, 50) == 50
    assert logic.reset_target("time", 10, 90, 5) == 10
    assert logic.reset_target("time", 10, 90, 500) == 90
    with pytest.raises(ValueError):
        logic.reset_target("time", 10, 90, None)


def test_preview_rows_say_replayed_skipped_unchanged_and_no_offset():
    rows = [logic.preview_row("b", 0, 0, 100, 80, 20),      # back: replay 60
            logic.preview_row("b", 1, 0, 100, 30, 100),     # forward: skip 70
            logic.preview_row("b", 2, 0, 100, 40, 40),
            logic.preview_row("b", 3, 0, 100, None, 0)]
    assert [r.effect for r in rows] == ["replay 60", "skip 70", "unchanged", "not moved: no offset yet"]
    assert rows[3].target is None          # the broker resets committed offsets only
    assert [r.change for r in rows] == [-60, 70, 0, 0]
    assert logic.preview_totals(rows) == (60, 70)


# -- scans --------------------------------------------------------------------------------------


def R(q, first, stop, b="b"):
    return logic.ScanRange(b, q, first, stop)


def test_scan_plan_fits_the_budget_newest_first_and_shares_leftovers():
    plan, cut = logic.scan_plan([R(0, 0, 10), R(1, 0, 1000), R(2, 500, 600)], 100)
    assert logic.scan_total(plan) == 100 and cut
    by_q = {r.queue_id: r for r in plan}
    assert by_q[0] == R(0, 0, 10)                  # a small queue is read whole
    # the rest is shared equally by the two larger ones, from their newest end
    assert by_q[1] == R(1, 955, 1000) and by_q[2] == R(2, 555, 600)


def test_scan_plan_uncut_when_everything_fits_and_empty_ranges_dropped():
    plan, cut = logic.scan_plan([R(0, 0, 10), R(1, 5, 5)], 100)
    assert plan == [R(0, 0, 10)] and not cut
    with pytest.raises(ValueError):
        logic.scan_plan([R(0, 0, 10)], 0)


def test_scan_plan_never_exceeds_the_hard_cap():
    plan, cut = logic.scan_plan([R(q, 0, 10**9) for q in range(4)], 10**12)
    assert logic.scan_total(plan) == logic.MAX_SCAN_MESSAGES and cut


def test_time_range_is_inclusive_and_open_ended():
    assert logic.in_time_range(10, 10, 20) and logic.in_time_range(20, 10, 20)
    assert not logic.in_time_range(9, 10, 20) and not logic.in_time_range(21, 10, 20)
    assert logic.in_time_range(5, None, None) and logic.in_time_range(5, None, 5)
    assert not logic.in_time_range(5, 6, None)


def test_message_matches_body_bytes_or_a_property():
    assert logic.message_matches(b"\x00order-42 paid", {}, "order-42", None)
    assert not logic.message_matches(b"order-4", {}, "order-42", None)
    assert logic.message_matches(b"", {"region": "eu"}, "eu", "region")
    assert not logic.message_matches(b"eu", {"region": "us"}, "eu", "region")
    assert logic.message_matches("čaj".encode(), {}, "čaj", None)


# -- pages, names, cache ------------------------------------------------------------------------


def test_paginate_bounds():
    items = list(range(120))
    p = logic.paginate(items, 2, 50)
    assert p.items == list(range(50, 100)) and p.pages == 3 and p.total == 120
    assert logic.paginate(items, 99, 50).page == 3          # past the end: the last page
    assert logic.paginate(items, -4, 50).page == 1
    assert logic.paginate(items, 1, 10_000).per_page == logic.MAX_PER_PAGE
    assert logic.paginate([], 1).pages == 1


def test_search_names_is_case_insensitive_and_sorted():
    assert logic.search_names(["Orders", "payments", "order_dlq"], "ORDER") == ["Orders", "order_dlq"]
    assert logic.search_names(["b", "a"], "") == ["a", "b"]


def test_ttl_cache_expires_and_is_bounded():
    c = logic.TtlCache(ttl_ms=1000, max_entries=2)
    c.put("a", 1, 0)
    assert c.get("a", 999) == 1 and c.get("a", 1000) is None
    c.put("b", 2, 0)
    c.put("c", 3, 0)
    assert c.get("a", 1) is None and c.get("c", 1) == 3


# -- time, bodies -------------------------------------------------------------------------------


def test_parse_local_time_forms():
    from datetime import timezone
    assert logic.parse_local_time("2024-05-01T10:30", timezone.utc) == 1714559400000
    assert logic.parse_local_time("2024-05-01T10:30:05", timezone.utc) == 1714559405000
    assert logic.parse_local_time("1714559400000") == 1714559400000
    assert logic.parse_local_time("") is None and logic.parse_local_time(None) is None
    with pytest.raises(ValueError, match="bad time"):
        logic.parse_local_time("yesterday")


def test_body_views_text_hex_json_and_cut():
    v = logic.body_views(b'{"a": [1, 2]}')
    assert v["text"] == '{"a": [1, 2]}' and v["json"] == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert v["hex"].startswith("00000000  7b 22 61 22") and v["hex"].endswith('{"a": [1, 2]}')
    b = logic.body_views(b"\xff\x00abc", max_bytes=2)
    assert b["json"] is None and b["cut"] and b["size"] == 5 and b["text"] == "\ufffd\x00"


# -- auth ---------------------------------------------------------------------------------------

SALT = b"0123456789abcdef"


def test_password_hash_round_trip_and_salt():
    h = auth.hash_password("s3cret", SALT, n=2 ** 10)
    assert h.startswith("scrypt$1024$8$1$") and "s3cret" not in h
    assert auth.verify_password("s3cret", h)
    assert not auth.verify_password("s3cret!", h)
    assert auth.hash_password("s3cret", b"other salt 12345", n=2 ** 10) != h
    assert not auth.verify_password("x", "pbkdf2$1$2$3$00$00") and not auth.verify_password("x", "garbage")


def test_users_file_parsing_names_the_line():
    h = auth.hash_password("pw", SALT, n=2 ** 10)
    users = auth.parse_users(f"# accounts\n\nalice:admin:{h}\nbob:viewer:{h}\n", "users.txt")
    assert users["alice"].role == "admin" and users["bob"].role == "viewer"
    for text, want in [(f"alice:root:{h}", "users.txt:1: role must be"), ("alice:admin:plain", "users.txt:1: the hash"),
                       ("alice:admin", "users.txt:1: expected"), (f"a:admin:{h}\na:viewer:{h}", "users.txt:2: user a"),
                       ("# nothing\n", "users.txt: no account")]:
        with pytest.raises(auth.UsersFileError, match=want):
            auth.parse_users(text, "users.txt")


def test_session_cookie_is_signed_and_expires():
    secret = b"k" * 32
    s = auth.Session("alice", "viewer", 1000, "n1")
    cookie = auth.make_session_cookie(secret, s)
    assert auth.read_session_cookie(secret, cookie, 999) == s
    assert auth.read_session_cookie(secret, cookie, 1000) is None                 # expired
    assert auth.read_session_cookie(b"x" * 32, cookie, 0) is None                 # another secret
    forged = cookie.replace("|viewer|", "|admin|")
    assert auth.read_session_cookie(secret, forged, 0) is None                    # role changed: mac fails
    assert auth.read_session_cookie(secret, "a|b", 0) is None and auth.read_session_cookie(secret, None, 0) is None


def test_csrf_token_bound_to_the_session_nonce():
    secret = b"k" * 32
    t = auth.csrf_token(secret, "n1")
    assert auth.csrf_ok(secret, "n1", t)
    assert not auth.csrf_ok(secret, "n2", t)
    assert not auth.csrf_ok(secret, "n1", None) and not auth.csrf_ok(secret, "n1", "")


# -- ACL form -----------------------------------------------------------------------------------


def test_acl_form_checked_by_the_acl_rules():
    cfg = logic.acl_config_from_form({"accessKey": " orderUser ", "secretKey": "orderSecret", "admin": "on",
                                      "topicPerms": "OrdersT=PUB|SUB, AuditT=SUB", "groupPerms": "",
                                      "whiteRemoteAddress": "10.0.0.*"})
    assert cfg["accessKey"] == "orderUser" and cfg["admin"] is True
    assert cfg["topicPerms"] == ["OrdersT=PUB|SUB", "AuditT=SUB"] and cfg["groupPerms"] is None
    assert (cfg["defaultTopicPerm"], cfg["defaultGroupPerm"]) == ("DENY", "SUB")
    for form, want in [({"accessKey": "short", "secretKey": "orderSecret"}, "longer than 6"),
                       ({"accessKey": "orderUser", "secretKey": "orderSecret", "topicPerms": "OrdersT=ALL"},
                        "not name=PERM"),
                       ({"accessKey": "orderUser", "secretKey": "orderSecret", "defaultGroupPerm": "READ"},
                        "defaultGroupPerm must be"),
                       ({"accessKey": "orderUser", "secretKey": "orderSecret", "whiteRemoteAddress": "10.0.0.300"},
                        "netaddress is 10.0.0.300")]:
        with pytest.raises(ValueError, match=want):
            logic.acl_config_from_form(form)
    assert logic.public_account({"accessKey": "a", "secretKey": "s", "admin": True}) == {"accessKey": "a",
                                                                                       "admin": True}


# -- orderly state ------------------------------------------------------------------------------

def test_client_orderly_reads_java_and_cpp_running_info():
    assert logic.client_orderly({"PROP_CONSUMEORDERLY": "true"}) is True
    assert logic.client_orderly({"PROP_CONSUMEORDERLY": "false"}) is False
    assert logic.client_orderly({"PROP_CONSUMEORDERLY": "flase"}) is False      # the C++ client's spelling
    assert logic.client_orderly({}) is None
    assert logic.client_orderly({"PROP_CONSUMEORDERLY": "maybe"}) is None


def test_orderly_text_says_what_clients_and_the_group_config_say():
    assert logic.orderly_text(False, []) == "-"
    assert logic.orderly_text(True, []) == "group config: orderly"
    assert logic.orderly_text(False, [True, True]) == "orderly"
    assert logic.orderly_text(False, [False]) == "concurrently"
    assert logic.orderly_text(True, [False]) == "concurrently · group config: orderly"
    assert logic.orderly_text(False, [True, False, False]) == "mixed: 1 of 3 clients orderly"
    assert logic.orderly_text(False, [True, None]) == "orderly (1 not telling)"
    assert logic.orderly_text(False, [None]) == "unknown (no client tells)"


def test_replication_text_never_shows_minus_one():
    from pocketmq.console.data import replication_text
    assert replication_text({}) == ""
    assert replication_text({"haLagBytes": "120", "haLagMillis": "3", "haMasterAddr": "h:10912"}) \
        == "120 B / 3 ms behind h:10912"
    assert replication_text({"haLagBytes": "-1", "haLagMillis": "1", "haMasterAddr": "h:10912"}) \
        == "lag not known yet (no frame from h:10912 so far)"
    assert replication_text({"haSlaveLagBytes_10.0.0.2:5": "0", "haSlaveLagBytes_10.0.0.3:5": "-1"}) \
        == "slave 10.0.0.2:5: 0 B behind; slave 10.0.0.3:5: lag not known yet"
