"""Fuzz the plain ACL of both daemons (issue 32): seeded hostile signed frames and hostile
plain_acl.yml files against real processes with aclEnable=true.

Each case opens its own connection and sends one request, then a valid signed request on the
same connection, which must be answered SUCCESS (a refusal costs nothing else):
  * a signed request of any code the daemon serves, its signature mutated (flipped, cut,
    empty, not Base64, not ASCII, 100 KB) or left right, its AccessKey hostile at times;
  * a huge ext map (up to 20,000 fields), signed or not;
  * JSON booleans and numbers in extFields (as ali-ons sends them), signed as JavaScript
    prints them (must be accepted) or as Python would (must be refused);
  * hostile heartbeat bodies, signed.
Between batches the ACL file is replaced by a hostile one (not YAML, deep nesting, an alias
bomb, binary, wrong shapes, keys too short, bad patterns, huge), truncated and rewritten in
place as an editor may: each must be refused (the daemon logs it within its poll), the
previous accounts staying in force (the probe keeps working, also right after the original
file is written back the same way). Invariants: the
daemon never exits and its log never shows a traceback.

POCKETMQ_FUZZ_SEED / POCKETMQ_FUZZ_ITERATIONS as tests/fault/test_fuzz_daemons.py.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import struct
import time

import pytest

from pocketmq.common.acl import AclConfigError, parse_acl_file
from pocketmq.protocol.acl import sign, sign_request
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand, encode
from tests.fault.test_fuzz_daemons import BASE_FIELDS, HOSTILE_VALUES, _codes, _exchange, _hostile_body
from tests.integration.test_acl_broker import ADMIN, APP, start_acl_cluster
from tests.integration.test_broker import send_cmd

pytestmark = [pytest.mark.asyncio, pytest.mark.fault]

ITERATIONS = int(os.environ.get("POCKETMQ_FUZZ_ITERATIONS", "500"))
SEED = int(os.environ.get("POCKETMQ_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
YAML_EVERY = 100


def hostile_yaml(rng: random.Random) -> bytes:
    pick = rng.randrange(10)
    if pick == 0:
        return rng.randbytes(rng.randrange(1, 4000))
    if pick == 1:
        return ("[" * 20000 + "]" * 20000).encode()
    if pick == 2:
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
            for p, c in zip("abcdefgh", "bcdefghi"))
        return (bomb + rng.choice(["globalWhiteRemoteAddresses: *i\n", "accounts: *i\n"])).encode()
    if pick == 3:
        return b"accounts:\n  - accessKey: short\n    secretKey: 1\n"
    if pick == 4:
        return b"globalWhiteRemoteAddresses: [999.1.1.*]\naccounts: []\n"
    if pick == 5:
        return b"accounts:\n  - accessKey: abcdefgh\n    secretKey: abcdefgh\n    topicPerms: [a=b=c]\n"
    if pick == 6:
        return b"a: !!python/object/apply:os.system ['touch /tmp/pwned']\n"
    if pick == 7:
        return b"accounts: {" + b"k: v, " * rng.choice([150_000, 200_000]) + b"}"   # under and over 1 MiB
    if pick == 8:
        return "accounts:\n  - accessKey: \udcff\n".encode("utf-8", "surrogateescape")
    return b"accounts: [" + b"{accessKey: abcdefgh, secretKey: [1, 2]}, " * rng.randrange(1, 50) + b"]"


def mutate_signature(rng: random.Random, sig: str) -> str:
    pick = rng.randrange(7)
    if pick == 0:
        i = rng.randrange(len(sig))
        return sig[:i] + chr(ord(sig[i]) ^ 1) + sig[i + 1:]
    if pick == 1:
        return sig[:rng.randrange(len(sig))]
    if pick == 2:
        return ""
    if pick == 3:
        return "!!not base64!!"
    if pick == 4:
        return "é" * rng.randrange(1, 40)
    if pick == 5:
        return "A" * 100_000
    return sig


def hostile_request(rng: random.Random, codes: list[int], creds) -> tuple[RemotingCommand, str]:
    kind = rng.choice(["signed", "huge", "json-scalars", "heartbeat"])
    code = rng.choice(codes)
    body = rng.choice([b"", b"x" * rng.randrange(1, 5000), rng.randbytes(rng.randrange(1, 200))])
    if kind == "huge":
        ext = {f"k{i}": rng.choice(["v", "", "é" * 3]) for i in range(rng.randrange(1000, 20000))}
        ext = sign_request(ext, body, *creds) if rng.random() < 0.5 else ext
        return RemotingCommand(code, rng.randrange(1, 2**31), 0, None, ext, body), f"huge ext map, code {code}"
    if kind == "heartbeat":
        body = _hostile_body(rng)
        ext = sign_request({"x": "1"}, body, *creds)
        return RemotingCommand(R.HEART_BEAT, rng.randrange(1, 2**31), 0, None, ext, body), "signed hostile heartbeat"
    ext = dict(BASE_FIELDS)
    for key in rng.sample(list(ext), rng.randrange(0, 4)):
        ext[key] = rng.choice([v for v in HOSTILE_VALUES if "\ud800" not in v and "\udfff" not in v
                               and "\ud83d" not in v])
    ak = creds[0] if rng.random() < 0.8 else rng.choice(["", "\x00", "A" * 5000, "strangerKey", "é"])
    ext = sign_request(ext, body, ak, creds[1])
    ext["Signature"] = mutate_signature(rng, ext["Signature"])
    return RemotingCommand(code, rng.randrange(1, 2**31), 0, None, ext, body), f"signed code {code}"


def json_scalar_frame(rng: random.Random, opaque: int, creds, js: bool) -> bytes:
    """SEND_MESSAGE_V2 as ali-ons frames it: "k": false, "e": 1 as JSON, signed over their
    JavaScript text (js) or Python's (not js)."""
    ext = {"a": "FuzzP", "b": "AclT", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000),
           "h": 0, "i": "", "j": 0, "k": False, "m": False, "AccessKey": creds[0], "OnsChannel": "ALIYUN"}
    text = {k: (("false" if js else "False") if v is False else str(v)) for k, v in ext.items()}
    body = b"ali-ons-like"
    ext["Signature"] = sign("".join(text[k] for k in sorted(text)).encode() + body, creds[1])
    header = json.dumps({"code": 310, "language": "JAVA", "version": 317, "opaque": opaque, "flag": 0,
                         "extFields": ext}).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("aclfuzz")))
    yield c
    c.stop()


# The watcher polls every second; the largest hostile file (~1 MB of YAML) parses in ~2 s
# with libyaml, ~9 s with PyYAML's pure-Python loader, slower under a loaded CI run.
REFUSAL_WAIT_S = 30.0


def _expected_line(bad: bytes) -> str:
    """What the daemon logs for this file (remoting/acl.py): a refused reload, or, for a
    file with no data, the accounts kept."""
    try:
        f = parse_acl_file(bad, "plain_acl.yml")
    except AclConfigError:
        return "ACL not reloaded"
    assert not f.has_data, f"the hostile file is a valid ACL file: {bad[:80]!r}"
    return "has no data"


async def _logged(log_file, want: str) -> str:
    """The daemon's log text from here until `want` shows in it (or REFUSAL_WAIT_S)."""
    text = ""
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while want not in text and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        text += log_file.read()
    return text


async def fuzz(daemon, addr: str, acl_path: str, codes: list[int], probe, seed: int, iterations: int) -> dict:
    rng = random.Random(seed)
    log_file = open(daemon.log_path, encoding="utf-8", errors="replace")
    log_file.seek(0, os.SEEK_END)
    original = open(acl_path, "rb").read()
    answers: dict = {}
    seen_log = ""           # log text read while waiting for a refusal, not yet checked
    try:
        for i in range(iterations):
            desc = ""
            try:
                if i and i % YAML_EVERY == 0:
                    bad = hostile_yaml(rng)
                    desc = f"hostile yml {bad[:60]!r}"
                    with open(acl_path, "wb") as f:      # truncate, then write: as an editor may
                        f.write(bad)
                    # the daemon's poll (every second) read it and refused it (random bytes
                    # that are only blanks or a comment: kept the accounts, no data). Only that
                    # line ends the wait: a poll between the truncate and the write logs "no
                    # data" for the moment's empty file, which says nothing of this one.
                    want = _expected_line(bad)
                    seen = await _logged(log_file, want)
                    seen_log += seen
                    assert want in seen, f"the hostile file was not refused within {REFUSAL_WAIT_S} s"
                    with open(acl_path, "wb") as f:
                        f.write(original)
                follow = probe()
                follow.opaque = 2**31 - 1 - i
                if rng.random() < 0.15:
                    js = rng.random() < 0.5
                    opaque = rng.randrange(1, 2**30)
                    data = json_scalar_frame(rng, opaque, APP, js)
                    desc = f"ali-ons-like JSON scalars, signed as {'JavaScript' if js else 'Python'} prints them"
                    got = await _exchange(addr, data + encode(follow), {opaque, follow.opaque})
                    if opaque in got and daemon.name == "mqbroker":
                        assert (got[opaque].code == C.SUCCESS) == js, (desc, got[opaque])
                else:
                    cmd, desc = hostile_request(rng, codes, APP)
                    expect = {follow.opaque} | ({cmd.opaque} if cmd.code != R.PULL_MESSAGE else set())
                    got = await _exchange(addr, encode(cmd) + encode(follow), expect)
                    if cmd.opaque in got:
                        rc = got[cmd.opaque].code
                        answers[rc] = answers.get(rc, 0) + 1
                assert follow.opaque in got, "the signed request after it was not answered"
                assert got[follow.opaque].code == C.SUCCESS, got[follow.opaque]
                assert daemon.proc.poll() is None, f"{daemon.name} exited with {daemon.proc.returncode}"
                new_log = seen_log + log_file.read()
                seen_log = ""
                assert "Traceback" not in new_log, f"traceback in {daemon.name}'s log:\n{new_log[-3000:]}"
            except (AssertionError, OSError, asyncio.TimeoutError) as e:
                pytest.fail(f"{daemon.name} ACL fuzz seed={seed} case={i} ({desc}): {type(e).__name__}: {e}\n"
                            f"replay: POCKETMQ_FUZZ_SEED={SEED} pytest tests/fault/test_acl_fuzz.py")
    finally:
        with open(acl_path, "wb") as f:
            f.write(original)
        log_file.close()
    return answers


async def test_acl_fuzz_broker(cluster):
    print(f"ACL fuzz seed {SEED}, {ITERATIONS} cases")
    answers = await fuzz(cluster.broker, cluster.broker_addr, cluster.acl_path, _codes("broker"),
                         lambda: RemotingCommand(R.SEND_MESSAGE_V2, ext_fields=sign_request(
                             send_cmd("AclT", b"probe").ext_fields, b"probe", *APP), body=b"probe"),
                         SEED, ITERATIONS)
    print("broker answer codes:", dict(sorted(answers.items())))
    assert "ACL not reloaded" in cluster.broker.log_text() or ITERATIONS <= YAML_EVERY


async def test_acl_fuzz_nameserver(cluster):
    ns_acl = os.path.join(os.path.dirname(cluster.acl_path), "ns", "plain_acl.yml")
    answers = await fuzz(cluster.namesrv, cluster.namesrv_addr, ns_acl, _codes("namesrv"),
                         lambda: RemotingCommand(R.PUT_KV_CONFIG, ext_fields=sign_request(
                             {"namespace": "FuzzNS", "key": "k", "value": "v"}, None, *ADMIN)),
                         SEED + 1, ITERATIONS)
    print("nameserver answer codes:", dict(sorted(answers.items())))
