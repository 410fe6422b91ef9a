#!/usr/bin/env python3
"""Where a decode step's GPU time goes, from a kernel trace (tools/cuda_trace.cpp's CSV, taken by
tools/cuda_timeline.sh): per step the wall span, the GPU's busy time (the union of kernel
intervals) on the marker's stream (the session's main stream) and on the others (a lockstep
step's lanes), over the trace's last steps, per layer the phases around the other streams' work, the kernels by stream and
name, and how long kernels waited after their launch call returned (long waits: the GPU is
behind the host; short: the host is the bound). Steps and layers are found from a marker kernel
launched once per layer on the main stream (default: the RoPE + cache-append op).
usage: tools/cuda_timeline.py TRACE.csv [--marker SUBSTRING] [--layers N] [--steps S] [--top K]
"""
import argparse
import bisect
import collections
import re
import shutil
import statistics
import subprocess
import sys


def load(path):
    """(kernels, calls): kernels (start, end, stream, correlation, blocks, name), calls (start,
    end, thread, correlation, name), both sorted by start."""
    kernels, calls = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(",", 6)
            if len(parts) != 7 or parts[0] not in ("K", "R"):
                raise ValueError(f"{path}:{number}: want 'K|R,start,end,id,correlation,blocks,"
                                 f"name', got {line.strip()[:80]!r}")
            start, end, ident, corr, blocks = (int(p) for p in parts[1:6])
            if parts[0] == "K":
                kernels.append((start, end, ident, corr, blocks, parts[6]))
            else:
                calls.append((start, end, ident, corr, parts[6]))
    kernels.sort()
    calls.sort()
    return kernels, calls


def demangled(names):
    """{mangled: readable} through c++filt where there is one."""
    names = sorted(set(names))
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def short_name(name):
    """A kernel's function name: no namespaces, template arguments or parameters."""
    name = name.replace("(anonymous namespace)", "")
    depth, kept = 0, []
    for ch in name.split("(")[0]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            kept.append(ch)
    text = "".join(kept).strip()
    return re.split(r"\s", text)[-1].split("::")[-1] or name[:60]


def union(intervals):
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def median(values):
    return statistics.median(values) if values else 0.0


def analyse(kernels, calls, marker="rope_append", layers=16, steps=8):
    """The figures report() prints, as a dict (times in microseconds, per step or per layer)."""
    names = demangled(k[5] for k in kernels)
    marks = [k for k in kernels if marker in names[k[5]]]
    if len(marks) < 2 * layers:
        raise ValueError(f"{len(marks)} '{marker}' kernels: fewer than two steps of {layers}")
    main = marks[0][2]
    starts = [k[0] for k in marks if k[2] == main]
    # Steps from one step's first marker to the next's, counted back from the last step's first
    # layer (its own end is not marked). A bench interleaves dense and lockstep steps: where some
    # steps have other streams' kernels (a lockstep step's lanes), only those are counted.
    firsts = list(range(len(starts) - layers, -1, -layers))[::-1]
    windows = [(starts[i], starts[i + layers], i) for i in firsts[:-1]]
    kernel_starts = [k[0] for k in kernels]

    def inside(a, b):
        return kernels[bisect.bisect_left(kernel_starts, a):bisect.bisect_left(kernel_starts, b)]

    with_others = [w for w in windows if any(k[2] != main for k in inside(w[0], w[1]))]
    chosen = (with_others or windows)[-steps:]
    steps = len(chosen)
    totals = collections.Counter()
    window = []
    for a, b, _ in chosen:
        ks = inside(a, b)
        window += ks
        clip = [(k[0], min(k[1], b), k[2]) for k in ks]
        busy = union((s, e) for s, e, _ in clip)
        on_main = union((s, e) for s, e, st in clip if st == main)
        on_others = union((s, e) for s, e, st in clip if st != main)
        totals.update(span=b - a, kernels=len(ks), busy=busy, main=on_main, others=on_others,
                      overlap=on_main + on_others - busy, idle=b - a - busy)
    result = {"steps": steps, "main_stream": main, "lockstep": bool(with_others)}
    for key in ("span", "busy", "main", "others", "overlap", "idle"):
        result[key + "_us"] = totals[key] / steps / 1e3
    result["kernels"] = totals["kernels"] / steps
    # Layers: from one marker to the next, the other streams' first start and last end.
    phases = collections.defaultdict(list)
    for _, _, i0 in chosen:
        for i in range(i0, i0 + layers):
            a, b = starts[i], starts[i + 1]
            others = [k for k in inside(a, b) if k[2] != main]
            phases["layer"].append((b - a) / 1e3)
            if others:
                first_other = min(k[0] for k in others)
                last_other = max(k[1] for k in others)
                phases["marker to the other streams' first kernel"].append(
                    (first_other - a) / 1e3)
                phases["the other streams' first start to last end"].append(
                    (last_other - first_other) / 1e3)
                phases["their last end to the next marker"].append((b - last_other) / 1e3)
    result["layer_phases_us"] = {k: median(v) for k, v in phases.items()}
    table = collections.defaultdict(lambda: [0, 0])
    for s, e, stream, _, _, name in window:
        key = ("main" if stream == main else "other", short_name(names[name]))
        table[key][0] += 1
        table[key][1] += e - s
    result["kernels_by_name"] = sorted(
        ((where, name, n / steps, total / steps / 1e3) for (where, name), (n, total) in
         table.items()), key=lambda row: -row[3])
    launched = {c[3]: c for c in calls}
    waits = [k[0] - launched[k[3]][1] for k in window if k[3] in launched]
    result["launch_wait_us"] = {
        "median": median(waits) / 1e3,
        "p90": (statistics.quantiles(waits, n=10)[-1] if len(waits) > 1 else 0.0) / 1e3,
        "matched": len(waits)}
    threads = collections.defaultdict(lambda: [0, 0])
    call_starts = [c[0] for c in calls]
    for a, b, _ in chosen:
        for s, e, thread, _, _ in calls[bisect.bisect_left(call_starts, a):
                                        bisect.bisect_left(call_starts, b)]:
            threads[thread][0] += 1
            threads[thread][1] += e - s
    result["threads"] = sorted(((t, n / steps, total / steps / 1e3)
                                for t, (n, total) in threads.items()), key=lambda r: -r[2])
    return result


def report(r, top=25):
    kind = "lockstep steps (other streams at work)" if r["lockstep"] else "steps"
    print(f"{r['steps']} {kind}; per step: span {r['span_us']:.1f} us, {r['kernels']:.0f} kernels, "
          f"GPU busy {r['busy_us']:.1f} us (main stream {r['main_us']:.1f}, other streams "
          f"{r['others_us']:.1f}, both at once {r['overlap_us']:.1f}), idle {r['idle_us']:.1f}")
    for name, value in r["layer_phases_us"].items():
        print(f"  per layer (median), {name}: {value:.1f} us")
    w = r["launch_wait_us"]
    print(f"  kernel start after its launch call returned: median {w['median']:.1f} us, "
          f"p90 {w['p90']:.1f} ({w['matched']} kernels)")
    print("  kernels per step (durations include a dependent launch's wait for the one before):")
    for where, name, count, total in r["kernels_by_name"][:top]:
        print(f"    {where:5s} {name[:50]:50s} {count:6.1f} x {total / max(count, 1e-9):7.2f} us"
              f" = {total:8.1f} us")
    for thread, count, total in r["threads"][:10]:
        print(f"  host thread {thread}: {count:.0f} runtime calls, {total:.0f} us per step")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--marker", default="rope_append",
                   help="a kernel name part: one such kernel per layer on the main stream")
    p.add_argument("--layers", type=int, default=16, help="markers per step (the model's layers)")
    p.add_argument("--steps", type=int, default=8,
                   help="the last S whole steps (a bench's timed steps come last)")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    try:
        kernels, calls = load(a.trace)
        report(analyse(kernels, calls, a.marker, a.layers, a.steps), a.top)
    except (OSError, ValueError) as e:
        sys.exit(f"cuda_timeline: {e}")


if __name__ == "__main__":
    main()
