"""`pocketmq console` in headless Chromium (Debian's chromium driven by Playwright) against
real nameserver and broker processes: every page loads without console errors, a message
sent by the Apache C++ client is found by id, key and time, the live tail shows a message
within 1 s of its send, a group's lag chart and reset-with-preview work end to end, a
read-only console refuses forged writes, login and CSRF are enforced, "resend to a group"
hands a message to one client of a group, a group shows as orderly. The tests take the
README's screenshots (into docs/images/console-*.png with POCKETMQ_CONSOLE_SCREENSHOTS=1).

One browser, one cluster and three console processes (plain, --read-only, --users) for the
module; the consoles sample lag every 0.5 s (--lag-sample-s) so the chart fills quickly.
"""
from __future__ import annotations

import os
import time
import urllib.parse

import pytest

from tests.support.browser import ConsoleErrors, chromium_path, console_daemon, why_no_browser
from tests.support.daemons import Cluster

_why = why_no_browser()
if _why:
    pytest.skip(_why, allow_module_level=True)
pytest.importorskip("starlette", reason="the console extra is not installed (pip install 'pocketmq[console]')")

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from pocketmq.client import sync  # noqa: E402
from pocketmq.client.message import Message  # noqa: E402
from pocketmq.console.auth import hash_password  # noqa: E402
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig, TopicConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES = os.path.join(ROOT, "docs", "images")
TOPIC = "ConsoleTopic"
LAG_TOPIC = "ConsoleLagTopic"
LAG_GROUP = "console_lag_group"
IDLE_GROUP = "console_idle_group"     # a group that never committed an offset
DIRECT_GROUP = "console_direct_group"  # orderly by its config (consumeMessageOrderly) and its client
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("console")))
    c.start()
    yield c
    c.stop()


async def _admin_session(ns):
    from pocketmq.tools.mqadmin.session import AdminSession
    return AdminSession(ns)


@pytest.fixture(scope="module")
def admin(cluster):
    """An AdminSession on the blocking facade's loop (setup and checks of broker state)."""
    s = sync.run(_admin_session(cluster.namesrv_addr))
    yield s
    sync.run(s.close())


@pytest.fixture(scope="module")
def producer(cluster):
    with sync.Producer("console_test_producer", cluster.namesrv_addr) as p:
        yield p


@pytest.fixture(scope="module")
def setup(cluster, admin, producer):
    """ConsoleTopic (4 queues) with a few messages; ConsoleLagTopic (2 queues) with 10 messages
    each and the group console_lag_group committed at 3 on queue 0 and 5 on queue 1;
    console_idle_group never committed anything; console_direct_group's config is orderly."""
    for t, n in ((TOPIC, 4), (LAG_TOPIC, 2)):
        sync.run(admin.api.create_topic(cluster.broker_addr, TopicConfig(t, n, n), "TBW102"))
    sync.run(admin.api.update_subscription_group(cluster.broker_addr, SubscriptionGroupConfig(LAG_GROUP)))
    for i in range(3):
        producer.send(Message(TOPIC, f'{{"order": {i}, "state": "paid"}}', tags="TagA", keys=f"order-{i}"))
    for q in (0, 1):
        for i in range(10):
            producer.send(Message(LAG_TOPIC, f"lag-{q}-{i}"), queue=MessageQueue(LAG_TOPIC, "broker-a", q))
    for q, off in ((0, 3), (1, 5)):
        mq = MessageQueue(LAG_TOPIC, "broker-a", q)
        sync.run(admin.api.update_consumer_offset(cluster.broker_addr, LAG_GROUP, mq, off))
    sync.run(admin.api.update_subscription_group(cluster.broker_addr, SubscriptionGroupConfig(IDLE_GROUP)))
    # set before the consoles start: their caches never saw it otherwise
    sync.run(admin.api.update_subscription_group(cluster.broker_addr,
                                                 SubscriptionGroupConfig(DIRECT_GROUP, consumeMessageOrderly=True)))


def _offset(admin, cluster, q: int) -> int:
    return sync.run(admin.api.query_consumer_offset(cluster.broker_addr, LAG_GROUP,
                                                    MessageQueue(LAG_TOPIC, "broker-a", q)))


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("users") / "users.txt"
    p.write_text(f"alice:admin:{hash_password('alice-pw', b'salt-alice-0123')}\n"
                 f"bob:viewer:{hash_password('bob-pw', b'salt-bob-0123456')}\n")
    return str(p)


@pytest.fixture(scope="module")
def consoles(cluster, setup, users_file, tmp_path_factory):
    logs = str(tmp_path_factory.mktemp("console-logs"))
    daemons = {"plain": console_daemon(cluster.namesrv_addr, logs, "--lag-sample-s", "0.5", name="plain"),
               "ro": console_daemon(cluster.namesrv_addr, logs, "--read-only", name="ro"),
               "login": console_daemon(cluster.namesrv_addr, logs, "--users", users_file, name="login")}
    try:
        for d in daemons.values():
            d.start()
        yield {k: d.match.group(1).rstrip("/") for k, d in daemons.items()}
    finally:
        for d in daemons.values():
            d.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser, shots):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.shots = shots
    pg.set_default_timeout(TIMEOUT_MS)
    pg.errors = ConsoleErrors(pg)
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the screenshots go: docs/images with POCKETMQ_CONSOLE_SCREENSHOTS=1 (to refresh the
    README's), else a temp dir (taken all the same, without dirtying the checkout each run)."""
    if os.environ.get("POCKETMQ_CONSOLE_SCREENSHOTS") == "1":
        os.makedirs(IMAGES, exist_ok=True)
        return IMAGES
    return str(tmp_path_factory.mktemp("screenshots"))


def _shot(page, name: str, full: bool = False) -> None:
    path = os.path.join(page.shots, name)
    page.screenshot(path=path, full_page=full)
    assert os.path.getsize(path) > 10_000, f"{name}: an empty-looking screenshot"


def _local(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ms / 1000))


# -- the tests ----------------------------------------------------------------------------------


def test_every_page_loads_without_console_errors(page, consoles, producer):
    base = consoles["plain"]
    r = producer.send(Message(TOPIC, "for the detail page", keys="detail"))
    q = urllib.parse.quote
    pages = ["/cluster", "/topics", "/topics?show=all", f"/topics/{TOPIC}", "/groups", f"/groups/{LAG_GROUP}",
             "/messages", f"/messages?topic={TOPIC}&by=time", f"/messages?msg_id={r.offset_msg_id}",
             "/search", f"/tail?topic={TOPIC}", "/dlq", f"/dlq?group={LAG_GROUP}", "/acl"]
    for path in pages:
        resp = page.goto(base + path)
        assert resp.status == 200, (path, resp.status, page.content()[-800:])
        page.wait_for_load_state("networkidle") if "/tail" not in path else page.wait_for_timeout(300)
        assert page.errors.take() == [], path
    page.goto(base + "/acl")
    expect(page.locator("#acl-off")).to_contain_text("aclEnable=false")
    # the cluster page shows the broker with its role, version and uptime
    page.goto(base + "/cluster")
    row = page.locator("#brokers tbody tr").first
    expect(row).to_contain_text("broker-a")
    expect(row).to_contain_text("MASTER")
    expect(row).to_contain_text(q("127.0.0.1"))
    _shot(page, "console-cluster.png")
    # static files are ours, not a CDN's
    for src in page.eval_on_selector_all("script[src], link[href]", "els => els.map(e => e.src || e.href)"):
        assert src.startswith(base), src


def test_cpp_client_message_found_by_id_key_and_time(page, consoles, cluster, tmp_path):
    try:
        import rocketmq.client  # noqa: F401
    except Exception:
        pytest.skip("the rocketmq==0.4.4 wheel (Apache C++ client) is not installed")
    from tests.interop.conftest import Agent
    before = int(time.time() * 1000) - 1000
    events = Agent(str(tmp_path)).run("produce", "--ns", cluster.namesrv_addr, "--topic", TOPIC, "--mode", "sync",
                                      "--count", "3", "--prefix", "cpp-body", "--tags", "CppTag")
    after = int(time.time() * 1000) + 1000
    sent = [e for e in events if e.get("event") == "sent"]
    assert len(sent) == 3, events
    msg_id = sent[1]["msg_id"]           # the C++ client's msgId (UNIQ_KEY); its key is key-1
    base = consoles["plain"]

    # by id: the form on the messages page
    page.goto(base + "/messages")
    page.fill("#by-id input[name=msg_id]", msg_id)
    page.fill("#by-id input[name=topic]", TOPIC)
    page.click("#by-id button")
    expect(page.locator("#results tbody tr")).to_have_count(1)
    expect(page.locator("#results")).to_contain_text("cpp-body-1")
    page.click(f"#results a:has-text('{msg_id}')")
    expect(page.locator("#msg-id")).to_have_text(msg_id)
    expect(page.locator("#body-text")).to_have_text("cpp-body-1")
    expect(page.locator("#msg-keys")).to_have_text("key-1")
    expect(page.locator("#properties")).to_contain_text("origin")      # the C++ agent's user property
    page.click("button[data-tab=hex]")
    expect(page.locator("#body-hex")).to_contain_text("63 70 70 2d 62 6f 64 79 2d 31")
    expect(page.locator("#message")).to_contain_text("broker-a / ")
    _shot(page, "console-message.png", full=True)
    assert page.errors.take() == []

    # by key
    page.goto(base + "/messages")
    page.fill("#by-key input[name=topic]", TOPIC)
    page.fill("#by-key input[name=key]", "key-1")
    page.click("#by-key button")
    expect(page.locator("#results")).to_contain_text(msg_id)
    expect(page.locator("#results")).to_contain_text("cpp-body-1")

    # by time: the three C++ messages lie in [before, after]
    page.goto(base + "/messages")
    page.fill("#by-time input[name=topic]", TOPIC)
    page.fill("#by-time input[name=begin]", _local(before))
    page.fill("#by-time input[name=end]", _local(after))
    page.click("#by-time button")
    for e in sent:
        expect(page.locator("#results")).to_contain_text(e["msg_id"])
    assert page.errors.take() == []


def test_live_tail_shows_a_message_within_one_second(page, consoles, producer):
    base = consoles["plain"]
    page.goto(f"{base}/tail?topic={TOPIC}&type=TAG&expr=TagA")
    expect(page.locator("#tail-status")).to_have_text("live")
    page.wait_for_timeout(300)                 # the held pulls reach the broker
    r = producer.send(Message(TOPIC, "tailed body", tags="TagA", keys="tail-1"))
    sent_at = time.monotonic()
    page.wait_for_selector(f"#tail tr[data-msg-id='{r.msg_id}']", timeout=3000)
    took = time.monotonic() - sent_at
    assert took < 1.0, f"the live tail showed the message {took:.2f} s after its send"
    # the tag filter: a TagB message is not shown
    skipped = producer.send(Message(TOPIC, "other tag", tags="TagB"))
    # pause: a message sent while paused appears only after resume (read from the last offset)
    page.click("#tail-pause")
    expect(page.locator("#tail-status")).to_have_text("paused")
    r2 = producer.send(Message(TOPIC, "sent while paused", tags="TagA"))
    page.wait_for_timeout(500)
    assert page.locator(f"#tail tr[data-msg-id='{r2.msg_id}']").count() == 0
    page.click("#tail-pause")
    page.wait_for_selector(f"#tail tr[data-msg-id='{r2.msg_id}']", timeout=5000)
    assert page.locator(f"#tail tr[data-msg-id='{skipped.msg_id}']").count() == 0
    rows = page.eval_on_selector_all("#tail tbody tr", "trs => trs.map(t => t.dataset.msgId + ' ' + t.innerText)")
    assert [r.split()[0] for r in rows] == [r2.msg_id, r.msg_id], rows
    _shot(page, "console-tail.png")
    assert page.errors.take() == []


def test_group_lag_chart_and_reset_with_preview(page, consoles, admin, cluster):
    base = consoles["plain"]
    page.goto(f"{base}/groups")
    expect(page.locator("#groups tr", has_text=LAG_GROUP).locator("td").nth(1)).to_have_text("12")
    # a group without any offset says so (rocketmq-dashboard shows -1), and sorts after the others
    expect(page.locator("#groups tr", has_text=IDLE_GROUP).locator("td").nth(1)).to_have_text("no offset yet")
    names = page.eval_on_selector_all("#groups tbody tr td:first-child", "tds => tds.map(t => t.innerText)")
    assert names.index(LAG_GROUP) < names.index(IDLE_GROUP), names
    page.goto(f"{base}/groups/{LAG_GROUP}")
    expect(page.locator("#total-lag")).to_have_text("12")
    expect(page.locator("#progress tr[data-queue='broker-a:1'] td").nth(5)).to_have_text("5")
    # the chart fills from the console's own samples (every 0.5 s here)
    page.wait_for_function("Number(document.getElementById('lag-chart').dataset.points || 0) >= 2")
    expect(page.locator("#lag-chart canvas")).to_have_count(1)

    # preview: nothing changes on the broker
    page.select_option("#reset-form select[name=topic]", LAG_TOPIC)
    page.select_option("#reset-form select[name=mode]", "earliest")
    page.click("#reset-form button")
    expect(page.locator("#reset-preview")).to_contain_text("8 messages replayed")
    expect(page.locator("#preview-table")).to_contain_text("replay 3")
    expect(page.locator("#preview-table")).to_contain_text("replay 5")
    _shot(page, "console-group.png", full=True)
    assert (_offset(admin, cluster, 0), _offset(admin, cluster, 1)) == (3, 5)

    # confirm: now the broker's offsets move
    page.click("#reset-confirm button")
    expect(page.locator("#applied")).to_be_visible()
    assert (_offset(admin, cluster, 0), _offset(admin, cluster, 1)) == (0, 0)
    expect(page.locator("#total-lag")).to_have_text("20")
    page.goto(f"{base}/groups/{IDLE_GROUP}")
    expect(page.locator("#total-lag")).to_have_text("no offset yet")
    assert page.errors.take() == []


def test_read_only_console_refuses_writes_even_forged(page, consoles, admin, cluster):
    base = consoles["ro"]
    page.goto(f"{base}/topics/{TOPIC}")
    expect(page.locator("header .badge.ro")).to_have_text("read-only")
    assert page.locator("form[action$='/send']").count() == 0
    assert page.locator("form[action$='/delete']").count() == 0
    csrf = page.locator("body").get_attribute("data-csrf")
    # a forged create with the page's own CSRF token is refused before anything is done
    resp = page.request.post(f"{base}/topics", form={"csrf": csrf, "topic": "ForgedTopic", "read": "1", "write": "1",
                                                     "perm": "RW"}, max_redirects=0)
    assert resp.status == 403 and "read-only" in resp.text()
    resp = page.request.post(f"{base}/groups/{LAG_GROUP}/reset/apply",
                             form={"csrf": csrf, "topic": LAG_TOPIC, "mode": "latest"}, max_redirects=0)
    assert resp.status == 403
    assert "ForgedTopic" not in sync.run(admin.topic_list())
    assert _offset(admin, cluster, 0) != 10 or _offset(admin, cluster, 1) != 10    # not reset to the end


def test_login_and_csrf_are_enforced(page, consoles, admin):
    base = consoles["login"]
    resp = page.goto(base + "/cluster")
    assert page.url.startswith(base + "/login")
    # a wrong password
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "nope")
    page.click("form[action='/login'] button")
    expect(page.locator("#error")).to_contain_text("wrong user name or password")
    # a write without logging in is refused, token or not
    csrf = page.locator("body").get_attribute("data-csrf")
    resp = page.request.post(f"{base}/topics", form={"csrf": csrf, "topic": "NoLogin"}, max_redirects=0)
    assert resp.status == 401

    # bob, a viewer: pages yes, writes no
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", "bob-pw")
    page.click("form[action='/login'] button")
    expect(page.locator("h1")).to_have_text("Cluster")
    page.goto(f"{base}/topics")
    assert page.locator("form[action='/topics'][method=post]").count() == 0
    csrf = page.locator("body").get_attribute("data-csrf")
    resp = page.request.post(f"{base}/topics", form={"csrf": csrf, "topic": "ByViewer"}, max_redirects=0)
    assert resp.status == 403 and "viewer" in resp.text()
    page.click("header form[action='/logout'] button")

    # alice, an admin: a write without the CSRF token (or with a wrong one) is refused ...
    page.goto(base + "/login")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-pw")
    page.click("form[action='/login'] button")
    expect(page.locator("header .who")).to_contain_text("alice")
    for form in ({"topic": "NoToken"}, {"topic": "BadToken", "csrf": "0" * 64}):
        resp = page.request.post(f"{base}/topics", form=dict(form, read="1", write="1", perm="RW"), max_redirects=0)
        assert resp.status == 403 and "CSRF" in resp.text()
    # ... and the page's own form works
    page.goto(f"{base}/topics")
    page.fill("form[action='/topics'][method=post] input[name=topic]", "ByAlice")
    page.click("form[action='/topics'][method=post] button")
    expect(page.locator("h1")).to_contain_text("ByAlice")
    topics = sync.run(admin.topic_list())
    assert "ByAlice" in topics and not {"NoLogin", "ByViewer", "NoToken", "BadToken"} & set(topics)
    # the signing secret and password hashes appear in no page
    assert "scrypt$" not in page.content()
    assert page.errors.take() == []


def test_content_search_is_bounded_and_shows_its_hits(page, consoles):
    base = consoles["plain"]
    page.goto(f"{base}/search?topic={TOPIC}")
    page.fill("#search-form input[name=needle]", '"state": "paid"')
    page.fill("#search-form input[name=limit]", "1000")
    page.click("#search-form button")
    expect(page.locator("#job-state")).to_have_text("done")       # the page polls until the scan ends
    expect(page.locator("#hits tbody tr")).to_have_count(3)        # the three setup orders
    expect(page.locator("#hits")).to_contain_text('{"order": 1, "state": "paid"}')
    # a property match, with a budget of 2 messages: at most 2 are read
    page.goto(f"{base}/search?topic={TOPIC}")
    page.fill("#search-form input[name=needle]", "cpp")
    page.fill("#search-form input[name=prop]", "origin")
    page.fill("#search-form input[name=limit]", "2")
    page.click("#search-form button")
    expect(page.locator("#job-state")).to_have_text("done")
    expect(page.locator("#job")).to_contain_text("of 2 messages scanned")
    expect(page.locator("#job")).to_contain_text("the range holds more")
    assert page.errors.take() == []


def test_dead_letters_trace_export_and_resend(page, consoles, admin, cluster, producer):
    from pocketmq.client.api import SendBackRequest
    group = "console_dlq_group"
    # the group consumes TOPIC (an offset there): the trace looks in its %RETRY% and %DLQ% topics
    sync.run(admin.api.update_consumer_offset(cluster.broker_addr, group, MessageQueue(TOPIC, "broker-a", 0), 0))
    r = producer.send(Message(TOPIC, "poison order", tags="TagA", keys="poison"))
    dead = sync.run(admin.api.view_message(cluster.broker_addr, int(r.offset_msg_id[-16:], 16)))
    # delay level -1: straight to %DLQ%<group>, as after the last failed retry
    sync.run(admin.api.send_back(SendBackRequest(cluster.broker_addr, group, dead.commit_log_offset, -1, r.msg_id,
                                                 TOPIC, None)))
    _wait_for_route(admin, "%DLQ%" + group)     # a new topic reaches the nameserver just after
    base = consoles["plain"]
    page.goto(f"{base}/dlq?group={group}")
    expect(page.locator("#dlq tbody tr")).to_have_count(1)
    expect(page.locator("#dlq")).to_contain_text("poison order")
    expect(page.locator("#dlq")).to_contain_text(TOPIC)              # the original topic
    # export
    csv_text = page.request.get(f"{base}/dlq/{group}/export?format=csv").text()
    assert csv_text.splitlines()[0].startswith("msgId,topic,") and "poison order" in csv_text
    rows = page.request.get(f"{base}/dlq/{group}/export?format=json").json()
    assert [(x["topic"], x["body"]) for x in rows] == [(TOPIC, "poison order")]
    # the original message's page shows its dead-letter copy, found by its UNIQ_KEY
    page.goto(f"{base}/messages?msg_id={r.offset_msg_id}")
    page.click(f"#results a:has-text('{r.msg_id}')")
    expect(page.locator("#body-text")).to_have_text("poison order")
    expect(page.locator("#trace")).to_contain_text("%DLQ%" + group)
    expect(page.locator("#trace")).to_contain_text(f"ORIGIN_MESSAGE_ID {r.msg_id}")
    # resend the dead letter to its original topic
    page.goto(f"{base}/dlq?group={group}")
    page.check("#dlq input[name=pick]")
    page.click("#dlq-form button")
    expect(page.locator("p.ok")).to_contain_text("1 messages resent")
    deadline = time.monotonic() + 5          # the broker's index is built just behind the send
    while True:
        copies = sync.run(admin.api.query_message(cluster.broker_addr, _key_query(TOPIC, "poison")))[0]
        resent = [m for m in copies if m.commit_log_offset != dead.commit_log_offset and m.topic == TOPIC]
        if resent or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(resent) == 1 and resent[0].body == b"poison order"
    assert resent[0].properties.get("CONSOLE_RESENT_FROM") == r.msg_id
    assert page.errors.take() == []


def test_resend_to_one_group_client_and_the_orderly_state(page, consoles, admin, cluster, producer):
    """"Resend to a group": the chosen client of the group runs its listener on the message
    (CONSUME_MESSAGE_DIRECTLY) and the page shows its result; the group's offset does not move.
    The group (an orderly consumer, its config consumeMessageOrderly) shows as orderly on the
    group page and the groups list. A read-only console has no such form and refuses it forged."""
    topic, group = "ConsoleDirectTopic", DIRECT_GROUP
    sync.run(admin.api.create_topic(cluster.broker_addr, TopicConfig(topic, 1, 1), "TBW102"))
    _wait_for_route(admin, topic)
    r = producer.send(Message(topic, "for one client", tags="TagD"))
    # the group's offset is past the message, so only a direct consumption can bring it to the listener
    mq = MessageQueue(topic, "broker-a", 0)
    sync.run(admin.api.update_consumer_offset(cluster.broker_addr, group, mq, 1))
    got = []
    consumer = sync.PushConsumer(group, cluster.namesrv_addr, listener=lambda m: got.append(m.body), orderly=True)
    consumer.subscribe(topic)
    with consumer:
        base = consoles["plain"]
        view = f"/messages/view?addr={cluster.broker_addr}&offset={int(r.offset_msg_id[-16:], 16)}"
        page.goto(base + view)
        option = page.locator("#direct-form select[name=target] option")
        expect(option).to_have_count(1)
        expect(option).to_have_text(f"{group}: {consumer.client_id} (PYTHON V4_9_4)")
        page.click("#direct-form button")
        expect(page.locator("#consume-result")).to_have_text("CR_SUCCESS")
        assert got == [b"for one client"]
        assert sync.run(admin.api.query_consumer_offset(cluster.broker_addr, group, mq)) == 1

        # the orderly state: the client's running info and the group's config
        page.goto(f"{base}/groups/{group}")
        expect(page.locator("#orderly")).to_have_text("orderly · group config: orderly")
        expect(page.locator("#clients tr", has_text=consumer.client_id).locator("td.orderly")).to_have_text("yes")
        # (the list shows the sampler's last round, every 0.5 s here: the page is read again until
        # a round after the client started is shown)
        cell = page.locator("#groups tr", has_text=group).locator("td.orderly")
        deadline = time.monotonic() + 5
        while True:
            page.goto(f"{base}/groups?q={group}")
            if cell.inner_text() == "orderly · group config: orderly" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        expect(cell).to_have_text("orderly · group config: orderly")

        # read-only: no form, and a forged request is refused before anything is sent
        ro = consoles["ro"]
        page.goto(ro + view)
        expect(page.locator("#msg-id")).to_have_text(r.msg_id)
        assert page.locator("#direct-form").count() == 0
        csrf = page.locator("body").get_attribute("data-csrf")
        resp = page.request.post(f"{ro}/messages/consume-directly", max_redirects=0, form={
            "csrf": csrf, "addr": cluster.broker_addr, "offset": view.rsplit("=", 1)[1],
            "target": f"{group} {consumer.client_id}"})
        assert resp.status == 403 and "read-only" in resp.text()
        assert got == [b"for one client"]
    assert page.errors.take() == []


def _wait_for_route(admin, topic: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sync.run(admin.find_route(topic)) is None:
        assert time.monotonic() < deadline, f"the nameserver never learned topic {topic}"
        time.sleep(0.1)


def _key_query(topic: str, key: str):
    from pocketmq.protocol.headers.typed import QueryMessageRequestHeader
    return QueryMessageRequestHeader(topic=topic, key=key, max_num=32, begin_timestamp=0,
                                     end_timestamp=2 ** 62)
