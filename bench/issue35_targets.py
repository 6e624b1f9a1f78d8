"""Issue 35's harness targets (items 1-3) read off consecutive peers.py runs (--json).

    python bench/issue35_targets.py /tmp/p35/run-split-{1..5}.json /tmp/p35/run-same-{1..5}.json

Runs are grouped by placement (--pin split / same, read from each run's meta). Per group:

  1  steady:  every cell of the pocketmq column (each scenario and body size: rate) within
              15% of that cell's median over the group's runs; the same shown for the peers'
              cells, which say how much of a spread is the host's (the widest of each side
              is printed under the verdicts)
  2  sync:    split: pocketmq sync >= 1.3x Redis Streams in every run, its p99 <= Redis's;
              same:  pocketmq sync >= 0.85x Redis Streams in every run
  3  window:  pocketmq `send(Message)` with 64 in flight >= 0.8x the py-store floor in every run

Ratios are taken within one run (the host's speed drifts between runs, ratios much less).
A missing cell (a --only run without that column) shows "-" and is not counted.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

STEADY = 0.15
SYNC_SPLIT, SYNC_SAME, WINDOW_FLOOR = 1.3, 0.85, 0.8
OURS, REDIS, FLOOR = "pocketmq", "redis-streams", "py-store"


def placement(run: dict) -> str:
    m = re.search(r"--pin (\w+)", run.get("meta", {}).get("run", ""))
    return m.group(1) if m else "none"


def cells(run: dict) -> dict:
    """(target, kind, size) -> result row."""
    return {(r["target"], r["kind"], r["size"]): r for r in run.get("results", ())}


def spread(runs: list[dict], target: str) -> list[tuple[str, list[float], float]]:
    """[(cell name, rates over the runs, largest deviation from the median as a fraction)]."""
    keys = sorted({(k, s) for run in runs for (t, k, s) in cells(run) if t == target})
    out = []
    for kind, size in keys:
        rates = [c[(target, kind, size)]["rate"] for c in map(cells, runs) if (target, kind, size) in c]
        if len(rates) < 2:
            continue
        med = statistics.median(rates)
        out.append((f"{kind} {size} B", rates, max(abs(r - med) for r in rates) / med if med else 0.0))
    return out


def ratio(c: dict, a: str, b: str, kind: str, size: int = 128):
    x, y = c.get((a, kind, size)), c.get((b, kind, size))
    if x is None or y is None or not y["rate"]:
        return None, x, y
    return x["rate"] / y["rate"], x, y


def report(pin: str, runs: list[dict]) -> tuple[list[str], dict]:
    lines = [f"## --pin {pin}: {len(runs)} runs", ""]
    verdict = {}
    lines += ["| cell | rates (msgs/s, run by run) | largest deviation from the median |", "|---|---|---|"]
    steady_ok = True
    widest: dict[str, tuple[float, str]] = {}      # ours / peers -> (deviation, cell)
    for target in (OURS, REDIS, FLOOR):
        for name, rates, dev in spread(runs, target):
            mark = ""
            if target == OURS:
                ok = dev <= STEADY
                steady_ok &= ok
                mark = " met" if ok else " **missed**"
            side = "ours" if target == OURS else "peers"
            if dev > widest.get(side, (-1.0, ""))[0]:
                widest[side] = (dev, f"{target} {name}")
            lines.append(f"| {target} {name} | {', '.join(f'{r:,.0f}' for r in rates)} | {dev * 100:.1f}%{mark} |")
    # one or two runs say nothing about steadiness (the issue asks for five)
    verdict["1 steady (pocketmq cells within 15% of their median)"] = steady_ok if len(runs) >= 3 else None
    lines.append("")
    need = SYNC_SPLIT if pin == "split" else SYNC_SAME
    sync_ok = window_ok = True
    rows = ["| run | sync vs Redis | p99 ours / Redis (µs) | window 64 vs py-store |", "|---|---|---|---|"]
    for i, run in enumerate(runs, 1):
        c = cells(run)
        r, x, y = ratio(c, OURS, REDIS, "sync")
        if r is None:
            sync_txt = "-"
        else:
            ok = r >= need and (pin != "split" or x["p99_us"] <= y["p99_us"])
            sync_ok &= ok
            sync_txt = f"{x['rate']:,.0f} vs {y['rate']:,.0f}: {r:.2f}x"
        p99 = f"{x['p99_us']:.0f} / {y['p99_us']:.0f}" if x and y else "-"
        w, wx, wy = ratio(c, OURS, FLOOR, "window")
        if w is None:
            win_txt = "-"
        else:
            window_ok &= w >= WINDOW_FLOOR
            win_txt = f"{wx['rate']:,.0f} vs {wy['rate']:,.0f}: {w:.2f}x"
        rows.append(f"| {i} | {sync_txt} | {p99} | {win_txt} |")
    lines += rows + [""]
    verdict[f"2 sync >= {need}x Redis in every run" + (" and p99 <= Redis's" if pin == "split" else "")] = sync_ok
    verdict[f"3 send(Message) x64 >= {WINDOW_FLOOR}x py-store in every run"] = window_ok
    lines += [f"- {name}: {'-' if ok is None else 'met' if ok else 'MISSED'}" for name, ok in verdict.items()]
    if "ours" in widest:
        # how much of a spread is the host's: the peers ran in the same runs, a minute apart
        peers = widest.get("peers")
        lines.append(f"- widest spread: ours {widest['ours'][0] * 100:.1f}% ({widest['ours'][1]}), the peers' "
                     + ("-" if peers is None else f"{peers[0] * 100:.1f}% ({peers[1]})"))
    return lines + [""], verdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="peers.py --json files")
    a = ap.parse_args(argv)
    groups: dict[str, list[dict]] = {}
    for path in a.runs:
        with open(path) as f:
            run = json.load(f)
        groups.setdefault(placement(run), []).append(run)
    for pin in sorted(groups):
        lines, _ = report(pin, groups[pin])
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
