#!/usr/bin/env python3
"""Markdown tables of every policy at several sparsities from `kvlens-cli eval --json` files:
co-reference accuracy and coverage (--coref files), perplexity (--ppl files) and the effective
sparsity of each. Results are keyed by (policy, sparsity); a later file replaces an earlier one's
row, so runs split over several processes (each (policy, sparsity) run of a lockstep session gives
the numbers it gives alone) merge into one table.

    policy_tables.py --coref out/coref_*.json --ppl out/ppl_*.json [--title "..."]
"""
import argparse
import json


def load(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                rows[(r["policy"], r["sparsity"])] = r
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coref", nargs="+", required=True)
    p.add_argument("--ppl", nargs="+", required=True)
    p.add_argument("--title", default="")
    args = p.parse_args()
    coref, ppl = load(args.coref), load(args.ppl)
    sparsities = sorted({s for (_, s) in coref if s > 0})
    policies = []
    for (policy, _) in coref:
        if policy not in policies:
            policies.append(policy)
    policies.sort(key=lambda name: (name != "dense", name != "oracle", name != "tokenbutler"))
    if args.title:
        print(f"**{args.title}**\n")
    print("| policy | " + " | ".join(f"{s:.0%}: eff. / acc. / cov. / ppl" for s in sparsities) + " |")
    print("| --- | " + " | ".join("---" for _ in sparsities) + " |")
    dense_c, dense_p = coref.get(("dense", 0.0)), ppl.get(("dense", 0.0))
    if dense_c and dense_p:
        cell = f"0 / {dense_c['accuracy']:.3f} / {dense_c['coverage']:.3f} / {dense_p['ppl']:.2f}"
        print("| dense | " + " | ".join(cell for _ in sparsities) + " |")
    for policy in policies:
        if policy == "dense":
            continue
        cells = []
        for s in sparsities:
            c, q = coref.get((policy, s)), ppl.get((policy, s))
            if not c or not q:
                cells.append("-")
                continue
            cells.append(f"{c['effective_sparsity']:.2f} / {c['accuracy']:.3f} / "
                         f"{c['coverage']:.3f} / {q['ppl']:.2f}")
        print(f"| {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
