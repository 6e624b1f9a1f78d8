"""Real signing clients against pocketmq's plain ACL (processes: mqnamesrv, mqbroker with
aclEnable=true, tests/integration/test_acl_broker.py's file): the Apache C++ client (wheel
rocketmq==0.4.4, `set_session_credentials(ak, sk, channel)`) and ali-ons 3.12 (`accessKeyId`
/ `accessKeySecret`) produce and consume with a permitted account and are refused with a
bad one; what each shows the application on a deny is recorded (printed, and in docs/acl.md).

The clients run in subprocesses (their scripts are below), one JSON object per line.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_acl_broker import ADMIN, AE, APP, PPM, signed, start_acl_cluster

pytestmark = [pytest.mark.interop, pytest.mark.slow]

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
TOPIC = "AclT"          # APP: PUB|SUB on it
DENIED_TOPIC = "OtherT"  # APP: default DENY
ONS_TOPIC = "OnsT"      # APP: PUB|SUB (ali-ons' own, so the C++ test's messages are not in it)

CPP = r'''
import json, sys, threading, time
from rocketmq.client import Producer, PushConsumer, Message
cmd, ns, topic, group, ak, sk, n = sys.argv[1:8]
n = int(n)
def emit(**kw): print(json.dumps(kw), flush=True)
if cmd == "produce":
    p = Producer(group, timeout=3000)
    p.set_namesrv_addr(ns)
    p.set_session_credentials(ak, sk, "LOCAL")
    p.start()
    for i in range(n):
        m = Message(topic); m.set_keys(f"k{i}"); m.set_body(f"cpp-{group}-{i}")
        try:
            r = p.send_sync(m)
            emit(event="sent", idx=i, status=int(r.status), msg_id=r.msg_id)
        except Exception as e:
            emit(event="error", idx=i, error_type=type(e).__name__, error=str(e))
    p.shutdown()
else:
    got = []
    lock = threading.Lock()
    def on_msg(msg):
        with lock:
            got.append(msg.body.decode())
            emit(event="msg", body=msg.body.decode())
    c = PushConsumer(group)
    c.set_namesrv_addr(ns)
    c.set_session_credentials(ak, sk, "LOCAL")
    c.subscribe(topic, on_msg)
    c.start()
    deadline = time.monotonic() + float(sys.argv[8])
    while time.monotonic() < deadline and len(got) < n:
        time.sleep(0.1)
    c.shutdown()
emit(event="done")
'''

ONS = r'''
const { Producer, Consumer, Message } = require('ali-ons');
const [cmd, ns, topic, group, ak, sk, n, seconds] = process.argv.slice(1);
const emit = o => process.stdout.write(JSON.stringify(o) + '\n');
// what ali-ons logs at warn/error is what an application's logger shows: recorded
const text = a => a.map(x => String(x && x.message || x)).join(' ');
const quiet = { info() {}, debug() {}, warn(...a) { emit({ event: 'log', level: 'warn', text: text(a) }); },
  error(...a) { emit({ event: 'log', level: 'error', text: text(a) }); } };
(async () => {
  const base = { httpclient: {}, nameSrv: ns, accessKeyId: ak, accessKeySecret: sk, logger: quiet };
  if (cmd === 'produce') {
    const p = new Producer(Object.assign({ producerGroup: group }, base));
    p.on('error', e => emit({ event: 'client_error', error: String(e && e.message || e) }));
    try { await p.ready(); } catch (e) { emit({ event: 'ready_error', error: String(e && e.message || e) }); }
    for (let i = 0; i < Number(n); i++) {
      try {
        const r = await p.send(new Message(topic, 'TagA', `ons-${group}-${i}`));
        emit({ event: 'sent', idx: i, status: r.sendStatus, msg_id: r.msgId });
      } catch (e) {
        emit({ event: 'error', idx: i, name: e.name, code: e.code, error: String(e && e.message || e) });
      }
    }
    try { await p.close(); } catch (e) { emit({ event: 'close_error', error: String(e && e.message || e) }); }
  } else {
    const c = new Consumer(Object.assign({ consumerGroup: group, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
      persistConsumerOffsetInterval: 1000 }, base));
    c.on('error', e => emit({ event: 'client_error', error: String(e && e.message || e) }));
    let got = 0;
    c.subscribe(topic, '*', async msg => { got += 1; emit({ event: 'msg', body: msg.body.toString() }); });
    try { await c.ready(); } catch (e) { emit({ event: 'ready_error', error: String(e && e.message || e) }); }
    const deadline = Date.now() + Number(seconds) * 1000;
    while (Date.now() < deadline && got < Number(n)) await new Promise(r => setTimeout(r, 100));
    try { await c.close(); } catch (e) { emit({ event: 'close_error', error: String(e && e.message || e) }); }
  }
  emit({ event: 'done' });
  process.exit(0);
})().catch(e => { emit({ event: 'fatal', error: String(e && e.stack || e) }); process.exit(1); });
'''


def run(argv, cwd=None, env=None, timeout=90) -> list[dict]:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert events and events[-1]["event"] == "done", (r.returncode, r.stderr[-3000:], events)
    return events


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("aclinterop")))
    yield c
    c.stop()


async def count_stored(c, topic: str, prefix: str) -> int:
    """Messages whose body starts with `prefix`, pulled (as the admin) from every queue."""
    from tests.integration.test_broker import pull_cmd
    from pocketmq.protocol.message import decode_records
    client = RemotingClient()
    n = 0
    try:
        for q in range(4):
            offset = 0
            while True:
                r = await client.invoke(c.broker_addr, signed(pull_cmd(topic, q, offset, group="AuditG"), ADMIN))
                if r.code != C.SUCCESS:
                    break
                recs = decode_records(r.body)
                n += sum(1 for m in recs if m.body.startswith(prefix.encode()))
                offset = int(r.ext_fields["nextBeginOffset"])
    finally:
        await client.close()
    return n


async def create_topic(c, topic: str) -> None:
    client = RemotingClient()
    try:
        r = await client.invoke(c.broker_addr, signed(RemotingCommand(R.UPDATE_AND_CREATE_TOPIC, ext_fields={
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}), ADMIN))
        assert r.code == C.SUCCESS, r.remark
    finally:
        await client.close()
    await asyncio.sleep(1.0)   # the broker re-registers the new topic with the nameserver


# -- the C++ client ----------------------------------------------------------------------------

def cpp(c, home, *args, timeout=90) -> list[dict]:
    env = dict(os.environ, HOME=home, PYTHONUNBUFFERED="1")
    return run([sys.executable, "-c", CPP, args[0], c.namesrv_addr, *args[1:]], env=env, timeout=timeout)


async def test_cpp_client_with_credentials(acl_cluster, tmp_path):
    c, home = acl_cluster, str(tmp_path)
    await create_topic(c, TOPIC)
    await create_topic(c, DENIED_TOPIC)
    ok = await asyncio.to_thread(cpp, c, home, "produce", TOPIC, "CppPG", *APP, "5")
    assert [e["event"] for e in ok if e["event"] != "done"] == ["sent"] * 5, ok
    got = await asyncio.to_thread(cpp, c, home, "push", TOPIC, "CppCG", *APP, "5", "40")
    assert sorted(e["body"] for e in got if e["event"] == "msg") == [f"cpp-CppPG-{i}" for i in range(5)], got

    refused = {}
    for case, args in {"wrong secret": (TOPIC, "CppBadPG", APP[0], "wrongSecret9"),
                       "unknown key": (TOPIC, "CppBadPG2", "strangerKey", "strangerSecret"),
                       "no PUB": (DENIED_TOPIC, "CppBadPG3", *APP)}.items():
        ev = await asyncio.to_thread(cpp, c, home, "produce", *args, "1")
        errors = [e for e in ev if e["event"] == "error"]
        assert len(errors) == 1, ev
        refused[case] = f"{errors[0]['error_type']}: {errors[0]['error']}"
    print("\nC++ client shows on a deny:", json.dumps(refused, indent=1))
    # the application sees the wheel's ProducerSendSyncFailed "No route info of this topic" (the
    # C++ client retries the send on each broker, then gives up as if there were no route);
    # Java's remark, verbatim, is in its own log (~/logs/rocketmq-cpp), with "error code:1"
    for case, topic in (("wrong secret", TOPIC), ("unknown key", TOPIC), ("no PUB", DENIED_TOPIC)):
        assert refused[case].startswith(f"ProducerSendSyncFailed: No route info of this topic: {topic}"), refused
    cpp_log = "".join(open(os.path.join(root, f)).read() for root, _, files in os.walk(os.path.join(home, "logs"))
                      for f in files)
    for remark in (f"Check signature failed for accessKey={APP[0]}", "No acl config for strangerKey",
                   "No default permission for topic:OtherT"):
        assert f"processSendResponse error remark:org.apache.rocketmq.acl.common.AclException: {remark}" in cpp_log
    assert await count_stored(c, TOPIC, "cpp-CppBadPG") == 0
    assert await count_stored(c, DENIED_TOPIC, "cpp-") == 0

    # a consumer group without SUB, and a wrong secret: nothing delivered
    for group, creds in (("DeniedG", APP), ("CppCG2", (APP[0], "wrongSecret9"))):
        ev = await asyncio.to_thread(cpp, c, home, "push", TOPIC, group, *creds, "1", "8")
        assert not [e for e in ev if e["event"] == "msg"], ev
    log = c.broker.log_text()
    assert "ACL denied code 11" in log or "ACL denied code 34" in log


# -- ali-ons -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ali_ons():
    from tests.interop.test_ons_replication import ensure_ali_ons
    ensure_ali_ons()


def ons(c, *args, timeout=90) -> list[dict]:
    return run(["node", "-e", ONS, args[0], c.namesrv_addr, *args[1:]], cwd=NODE_DIR, timeout=timeout)


async def test_ali_ons_with_credentials(ali_ons, acl_cluster):
    c = acl_cluster
    await create_topic(c, ONS_TOPIC)
    await create_topic(c, DENIED_TOPIC)
    ok = await asyncio.to_thread(ons, c, "produce", ONS_TOPIC, "OnsPG", *APP, "5", "0")
    assert [e.get("status") for e in ok if e["event"] == "sent"] == ["SEND_OK"] * 5, ok
    got = await asyncio.to_thread(ons, c, "push", ONS_TOPIC, "OnsCG", *APP, "5", "40")
    assert sorted(e["body"] for e in got if e["event"] == "msg") == [f"ons-OnsPG-{i}" for i in range(5)], got

    refused = {}
    for case, args in {"wrong secret": (ONS_TOPIC, "OnsBadPG", APP[0], "wrongSecret9"),
                       "unknown key": (ONS_TOPIC, "OnsBadPG2", "strangerKey", "strangerSecret"),
                       "no PUB": (DENIED_TOPIC, "OnsBadPG3", *APP)}.items():
        ev = await asyncio.to_thread(ons, c, "produce", *args, "1", "0")
        errors = [e for e in ev if e["event"] in ("error", "ready_error", "client_error", "log", "close_error")]
        assert errors and not [e for e in ev if e["event"] == "sent"], ev
        refused[case] = errors
    print("\nali-ons shows on a deny:", json.dumps(refused, indent=1))
    # Producer#send rejects with its retry summary, not the remark ("Send [4] times, still
    # failed, ... Topic: X"); the remark itself surfaces verbatim where ali-ons throws a
    # broker's answer as is: close() (UNREGISTER_CLIENT, refused for a bad key or secret)
    for case, topic in (("wrong secret", ONS_TOPIC), ("unknown key", ONS_TOPIC), ("no PUB", DENIED_TOPIC)):
        sends = [e for e in refused[case] if e["event"] == "error"]
        assert len(sends) == 1 and sends[0]["error"].startswith("Send [4] times, still failed"), refused[case]
        assert f"Topic: {topic}" in sends[0]["error"]
    closes = {case: [e["error"] for e in ev if e["event"] == "close_error"] for case, ev in refused.items()}
    assert closes == {
        "wrong secret": [f"{AE}Check signature failed for accessKey={APP[0]}, {PPM}.validate(PlainPermissionManager"
                         f".java:684)"],
        "unknown key": [f"{AE}No acl config for strangerKey, {PPM}.validate(PlainPermissionManager.java:668)"],
        "no PUB": []}
    assert await count_stored(c, ONS_TOPIC, "ons-OnsBadPG") == 0
    assert await count_stored(c, DENIED_TOPIC, "ons-") == 0

    ev = await asyncio.to_thread(ons, c, "push", ONS_TOPIC, "DeniedG", *APP, "1", "8")
    assert not [e for e in ev if e["event"] == "msg"], ev
    # the consumer's ready() rejects with the remark (its heartbeat is refused), as does 'error'
    ready = [e["error"] for e in ev if e["event"] == "ready_error"]
    assert ready == [f"MQPushConsumer occurred an error {AE}No default permission for group:DeniedG, "
                     f"{PPM}.checkPerm(PlainPermissionManager.java:611)"], ev
