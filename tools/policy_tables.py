#!/usr/bin/env python3
"""Markdown tables of every policy at several sparsities from `kvlens-cli eval --json` files:
co-reference accuracy and coverage (--coref files), perplexity (--ppl files) and the effective
sparsity of each. Results are keyed by (policy, sparsity); a later file replaces an earlier one's
row, so runs split over several processes (each (policy, sparsity) run of a lockstep session gives
the numbers it gives alone) merge into one table. Rows of `eval --match effective` are keyed by
their target sparsity, and each cell ends with the nominal sparsity found for the co-reference and
the perplexity evaluations (each calibrated on its own samples or windows), and a "!" after a
figure whose target was not matched within the tolerance; its effective sparsity is given for both
evaluations (co-reference, perplexity).

    policy_tables.py --coref out/coref_*.json --ppl out/ppl_*.json [--title "..."]
"""
import argparse
import json


def load(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                rows[(r["policy"], r.get("target_sparsity", r["sparsity"]))] = r
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
    matched = any("target_sparsity" in r for r in coref.values())
    what = ("eff. (co-ref., ppl) / acc. / cov. / ppl (nominal: co-ref., ppl)" if matched else
            "eff. / acc. / cov. / ppl")
    print("| policy | " + " | ".join(f"{s:.0%}: {what}" for s in sparsities) + " |")
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
            if "target_sparsity" in c:
                def nominal(r):
                    return f"{r['sparsity']:.2f}" + ("" if r.get("matched", True) else "!")
                cell = (f"{c['effective_sparsity']:.2f}, {q['effective_sparsity']:.2f} / "
                        f"{c['accuracy']:.3f} / {c['coverage']:.3f} / {q['ppl']:.2f} "
                        f"(nominal {nominal(c)}, {nominal(q)})")
            else:
                cell = (f"{c['effective_sparsity']:.2f} / {c['accuracy']:.3f} / "
                        f"{c['coverage']:.3f} / {q['ppl']:.2f}")
            cells.append(cell)
        print(f"| {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
