"""Issue 13's targets read off side-by-side harness runs (../shared/bench/peers.py --json).

    python bench/issue13_targets.py /tmp/run-split.json /tmp/run-same.json [...]

Each run's placement (--pin same / split) is read from its meta; every target that
applies to that placement is computed from the 128 B cells of that run alone (ratios
within one run: the host's speed drifts, ratios less so), then a summary counts, per
target, the runs that met it. A cell missing from a run (a --only run, a failed target)
is shown as "-" and not counted. The targets (issue 13, "What must be reached"):

  1  --pin same:  sync >= 1x Redis Streams; consume >= 1.5x Redis; consume p99 < 5 ms;
                  busy polling on / off (pocketmq vs pocketmq-nobusy) shown, no verdict
  2  --pin split: send_batch >= 0.5x the py-store floor; its client CPU <= 3 µs a message
  3  --pin split: consume (poll 32 + commit) >= 0.4x the floor; its client CPU <= 4 µs
  4  --pin split: sync >= 1.5x Redis Streams and its p99 <= Redis's
  5  either:      SYNC_FLUSH 64 in flight (pocketmq-syncflush window) >= 2x Redis with
                  appendfsync always (redis-always)
"""
from __future__ import annotations

import argparse
import json
import re
import sys

SIZE = 128


def _cells(run: dict) -> dict:
    return {(r["target"], r["kind"]): r for r in run.get("results", ()) if r.get("size") == SIZE}


def placement(run: dict) -> str:
    """"same", "split" or "none", from the harness's meta line."""
    m = re.search(r"--pin (\w+)", run.get("meta", {}).get("run", ""))
    return m.group(1) if m else "none"


def _ratio(cells, a, b, kind):
    x, y = cells.get((a, kind)), cells.get((b, kind))
    if x is None or y is None or not y["rate"]:
        return None
    return x["rate"] / y["rate"]


def targets(run: dict) -> list[tuple[str, str, bool | None]]:
    """[(target, figure, met)] for one run; met is None when the run lacks a cell or the
    target has no verdict."""
    cells = _cells(run)
    pin = placement(run)
    out: list[tuple[str, str, bool | None]] = []

    def ratio_row(name, a, b, kind, at_least):
        r = _ratio(cells, a, b, kind)
        if r is None:
            out.append((name, "-", None))
        else:
            out.append((name, f"{cells[(a, kind)]['rate']:,.0f} vs {cells[(b, kind)]['rate']:,.0f}/s: {r:.2f}x",
                        r >= at_least))

    def cpu_row(name, target, kind, at_most):
        c = cells.get((target, kind))
        if c is None:
            out.append((name, "-", None))
        else:
            out.append((name, f"{c['cli_us_msg']:.1f} µs", c["cli_us_msg"] <= at_most))

    if pin == "same":
        ratio_row("1. one core: sync >= Redis", "pocketmq", "redis-streams", "sync", 1.0)
        ratio_row("1. one core: consume >= 1.5x Redis", "pocketmq", "redis-streams", "consume", 1.5)
        c = cells.get(("pocketmq", "consume"))
        out.append(("1. one core: consume p99 < 5 ms", "-" if c is None else f"{c['p99_us']:,.0f} µs",
                    None if c is None else c["p99_us"] < 5000))
    if pin in ("same", "split"):
        on_off = []
        for kind in ("sync", "window", "batch", "consume"):
            r = _ratio(cells, "pocketmq", "pocketmq-nobusy", kind)
            if r is not None:
                on_off.append(f"{kind} {r:.2f}x")
        out.append((f"1. busy polling on / off ({pin})", ", ".join(on_off) or "-", None))
    if pin == "split":
        ratio_row("2. send_batch >= 0.5x floor", "pocketmq", "py-store", "batch", 0.5)
        cpu_row("2. send_batch client CPU <= 3 µs", "pocketmq", "batch", 3.0)
        ratio_row("3. consume >= 0.4x floor", "pocketmq", "py-store", "consume", 0.4)
        cpu_row("3. consume client CPU <= 4 µs", "pocketmq", "consume", 4.0)
        ratio_row("4. sync >= 1.5x Redis", "pocketmq", "redis-streams", "sync", 1.5)
        p, r = cells.get(("pocketmq", "sync")), cells.get(("redis-streams", "sync"))
        out.append(("4. sync p99 <= Redis", "-" if p is None or r is None else
                     f"{p['p99_us']:,.0f} vs {r['p99_us']:,.0f} µs",
                     None if p is None or r is None else p["p99_us"] <= r["p99_us"]))
    ratio_row(f"5. SYNC_FLUSH 64 in flight >= 2x Redis always ({pin})", "pocketmq-syncflush", "redis-always",
              "window", 2.0)
    return out


def report(runs: list[tuple[str, dict]]) -> str:
    lines = []
    tally: dict[str, list[int]] = {}
    for name, run in runs:
        lines.append(f"## {name}: --pin {placement(run)}, {run.get('meta', {}).get('date', '?')}")
        lines.append("| target | figure | met |")
        lines.append("|---|---|---|")
        for target, figure, met in targets(run):
            lines.append(f"| {target} | {figure} | {'' if met is None else ('yes' if met else 'no')} |")
            if met is not None:
                t = tally.setdefault(target, [0, 0])
                t[0] += met
                t[1] += 1
        lines.append("")
    lines.append("## Runs that met each target")
    lines.append("| target | met / runs |")
    lines.append("|---|---|")
    for target, (met, n) in tally.items():
        lines.append(f"| {target} | {met} / {n} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="JSON files written by peers.py --json")
    a = ap.parse_args(argv)
    runs = []
    for path in a.runs:
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"{path}: not a harness JSON file ({e})")
        if not isinstance(run, dict) or not isinstance(run.get("results"), list):
            ap.error(f"{path}: no 'results' list (written by peers.py --json?)")
        runs.append((path, run))
    sys.stdout.write(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
