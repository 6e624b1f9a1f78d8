"""bench/issue35_targets.py: issue 35's verdicts (items 1-3) computed from harness runs (peers.py --json)."""
from __future__ import annotations

import json

from bench import issue35_targets as t


def cell(target, kind, rate, *, p99=100.0, size=128):
    return {"target": target, "kind": kind, "size": size, "rate": rate, "p99_us": p99}


def run(pin, cells):
    return {"meta": {"run": f"2 s measured per scenario, CPU placement --pin {pin} (servers [1])"}, "results": cells}


def split_run(ours_sync, redis_sync, ours_p99=100.0, redis_p99=200.0, ours_window=80_000, floor_window=100_000,
              redis_batch=50_000):
    return run("split", [
        cell("pocketmq", "sync", ours_sync, p99=ours_p99), cell("redis-streams", "sync", redis_sync, p99=redis_p99),
        cell("pocketmq", "window", ours_window), cell("py-store", "window", floor_window),
        cell("redis-streams", "batch", redis_batch),
    ])


def verdicts(pin, runs):
    _lines, v = t.report(pin, runs)
    return {name.split(" ")[0]: ok for name, ok in v.items()}


def test_every_item_met_when_each_run_meets_it():
    runs = [split_run(13_000 + 100 * i, 10_000) for i in range(5)]
    assert verdicts("split", runs) == {"1": True, "2": True, "3": True}


def test_one_run_decides_each_item():
    base = [split_run(13_000, 10_000) for _ in range(4)]
    # a sync rate 20% under the others' median: item 1 (and only it: 10,400 is still >= 1.3x)
    assert verdicts("split", base + [split_run(10_400, 8_000)]) == {"1": False, "2": True, "3": True}
    # p99 above Redis's in one run: item 2
    assert verdicts("split", base + [split_run(13_000, 10_000, ours_p99=201)]) == {"1": True, "2": False, "3": True}
    # 1.29x Redis in one run: item 2
    assert verdicts("split", base + [split_run(12_900, 10_000)])["2"] is False
    # the window at 0.79x the floor in one run: item 3
    assert verdicts("split", base + [split_run(13_000, 10_000, ours_window=79_000)])["3"] is False


def test_one_core_has_no_p99_rule_and_its_own_ratio():
    runs = [run("same", [cell("pocketmq", "sync", 8_500, p99=900), cell("redis-streams", "sync", 10_000, p99=100)])
            for _ in range(3)]
    assert verdicts("same", runs)["2"] is True                      # 0.85x, p99 not compared
    runs[1]["results"][0]["rate"] = 8_400
    assert verdicts("same", runs)["2"] is False                     # 0.84x


def test_steadiness_needs_three_runs_and_missing_cells_are_not_counted():
    assert verdicts("split", [split_run(13_000, 10_000)] * 2)["1"] is None
    runs = [split_run(13_000, 10_000) for _ in range(3)]
    runs[0]["results"] = [c for c in runs[0]["results"] if c["kind"] != "window"]
    lines, _ = t.report("split", runs)
    assert "| 1 | 13,000 vs 10,000: 1.30x | 100 / 200 | - |" in lines


def test_the_widest_spread_of_each_side_is_printed():
    runs = [split_run(13_000, 10_000, redis_batch=b) for b in (50_000, 50_000, 65_000)]
    runs[2]["results"][0]["rate"] = 14_000              # ours: sync 7.7% off its median
    lines, _ = t.report("split", runs)
    assert ("- widest spread: ours 7.7% (pocketmq sync 128 B), the peers' 30.0% (redis-streams batch 128 B)"
            in lines)


def test_runs_are_grouped_by_their_placement(tmp_path, capsys):
    paths = []
    for i, r in enumerate([split_run(13_000, 10_000), run("same", [cell("pocketmq", "sync", 1)])]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    assert t.main(paths) == 0
    out = capsys.readouterr().out
    assert "## --pin same: 1 runs" in out and "## --pin split: 1 runs" in out
