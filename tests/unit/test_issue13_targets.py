"""bench/issue13_targets.py: issue 13's verdicts computed from harness runs (peers.py --json)."""
from __future__ import annotations

import json

import pytest

from bench import issue13_targets as t


def cell(target, kind, rate, *, p99=100.0, cli=1.0, size=128):
    return {"target": target, "kind": kind, "size": size, "rate": rate, "p99_us": p99, "cli_us_msg": cli}


def run(pin, cells):
    return {"meta": {"date": "2026-11-26 06:00:00 UTC",
                     "run": f"5 s measured per scenario (+0.3 s warm-up), CPU placement --pin {pin} (servers [1])"},
            "results": cells}


SPLIT = run("split", [
    cell("pocketmq", "sync", 15000, p99=180), cell("redis-streams", "sync", 6000, p99=250),
    cell("pocketmq", "batch", 120000, cli=2.2), cell("py-store", "batch", 260000),
    cell("pocketmq", "consume", 200000, cli=4.1), cell("py-store", "consume", 400000),
    cell("pocketmq-nobusy", "sync", 5000), cell("pocketmq-nobusy", "consume", 100000),
    cell("pocketmq-syncflush", "window", 40000), cell("redis-always", "window", 20000),
    cell("pocketmq", "batch", 1, size=1024),            # other sizes are not read
])
SAME = run("same", [
    cell("pocketmq", "sync", 7000), cell("redis-streams", "sync", 12000),
    cell("pocketmq", "consume", 150000, p99=400), cell("redis-streams", "consume", 100000),
])


def verdicts(r):
    return {name: met for name, _figure, met in t.targets(r)}


def test_split_run_targets_computed_from_its_own_cells():
    v = verdicts(SPLIT)
    assert v["2. send_batch >= 0.5x floor"] is False                # 120k / 260k = 0.46x
    assert v["2. send_batch client CPU <= 3 µs"] is True
    assert v["3. consume >= 0.4x floor"] is True                   # 0.5x
    assert v["3. consume client CPU <= 4 µs"] is False             # 4.1
    assert v["4. sync >= 1.5x Redis"] is True and v["4. sync p99 <= Redis"] is True
    assert v["5. SYNC_FLUSH 64 in flight >= 2x Redis always (split)"] is True    # exactly 2x
    figures = {name: figure for name, figure, _ in t.targets(SPLIT)}
    assert figures["2. send_batch >= 0.5x floor"] == "120,000 vs 260,000/s: 0.46x"
    assert figures["1. busy polling on / off (split)"] == "sync 3.00x, consume 2.00x"
    assert "1. one core: sync >= Redis" not in v                   # a --pin same target


def test_same_run_targets_and_missing_cells():
    v = verdicts(SAME)
    assert v["1. one core: sync >= Redis"] is False and v["1. one core: consume >= 1.5x Redis"] is True
    assert v["1. one core: consume p99 < 5 ms"] is True
    assert v["5. SYNC_FLUSH 64 in flight >= 2x Redis always (same)"] is None     # not in this run
    assert "2. send_batch >= 0.5x floor" not in v


def test_report_counts_the_runs_that_met_each_target(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(SPLIT))
    slower = json.loads(json.dumps(SPLIT))
    slower["results"][0]["rate"] = 8000                             # sync 1.33x: missed
    b.write_text(json.dumps(slower))
    assert t.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| 4. sync >= 1.5x Redis | 1 / 2 |" in out
    assert "| 3. consume >= 0.4x floor | 2 / 2 |" in out
    assert "--pin split" in out


def test_files_that_are_not_harness_runs_are_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"results\": 3}")
    with pytest.raises(SystemExit):
        t.main([str(bad)])
    assert "no 'results' list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        t.main([str(tmp_path / "missing.json")])
    assert "not a harness JSON file" in capsys.readouterr().err
