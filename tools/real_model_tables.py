#!/usr/bin/env python3
"""The tables of tools/real_model_results.sh: from its OUT/runs folder (one `kvlens-cli eval
--json` file per (task, sparsity), named TASK_SPARSITY.json, with TASK_SPARSITY.time holding
"task, sparsity, seconds, exit status" and run.txt the run's key=value facts) one markdown file:
a table per task (rows policies, columns sparsities, each cell the task's score with the effective
sparsity and the top-50% hit rate), the policies' order at each sparsity, timings, machine and the
exact commands. Stdlib only.

    real_model_tables.py tables --runs OUT/runs --out OUT/results.md
    real_model_tables.py policies --registry POLICIES.json --have-predictor 0|1 [--only A,B]
"""

import argparse
import glob
import json
import os
import shlex
import sys

# (task, title, what the cells hold, whether lower is better)
TASKS = [
    ("wikitext2", "Perplexity on WikiText-2 test", "perplexity", True),
    ("c4", "Perplexity on the held-back C4 text", "perplexity", True),
    ("coref", "Co-reference on the bundled pools", "accuracy / coverage", False),
    ("coref_paper", "Co-reference on the TokenButler paper's pools", "accuracy / coverage", False),
]
REFERENCE = "dense"
ORACLE = "oracle"  # an upper bound, not a contender: never bold, marked in the orders


def select_policies(registry_path, have_predictor, only):
    """The ids to run, in the registry's order: `only` (checked against the registry) or every
    one, less those that need a predictor when there is none. The composed SCORER+ALLOCATOR ids
    run only when `only` names them (every scorer with every allocator would double the run)."""
    with open(registry_path) as f:
        registry = json.load(f)
    known = [p["id"] for p in registry]
    if only:
        wanted = [p.strip() for p in only.split(",") if p.strip()]
        unknown = [p for p in wanted if p not in known]
        if unknown:
            raise SystemExit(f"--policies: unknown {', '.join(unknown)} "
                             f"(known: {', '.join(known)})")
        return [p for p in known if p in wanted]
    return [p["id"] for p in registry if (have_predictor or not p.get("needs_predictor"))
            and not p.get("composed")]


def read_facts(runs):
    facts = {}
    path = os.path.join(runs, "run.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, _, value = line.rstrip("\n").partition("=")
                facts[key] = value
    return facts


def read_runs(runs):
    """{task: {sparsity: {"rows": {policy: row}, "seconds", "status", "json", "log"}}}"""
    out = {}
    for time_path in sorted(glob.glob(os.path.join(runs, "*.time"))):
        with open(time_path) as f:
            task, sparsity, seconds, status = f.read().split("\t")
        base = time_path[:-len(".time")]
        entry = {"seconds": float(seconds), "status": int(status), "rows": {},
                 "json": base + ".json", "log": base + ".log"}
        if entry["status"] == 0 and os.path.exists(entry["json"]):
            with open(entry["json"]) as f:
                doc = json.load(f)
            entry["doc"] = doc
            for row in doc["results"]:
                entry["rows"][row["policy"]] = row
        out.setdefault(task, {})[float(sparsity)] = entry
    return out


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        return lines[-1] if lines else "(empty log)"
    except OSError:
        return "(no log)"


def score(row, lower_is_better):
    """What a column is ranked by (the larger, the better): minus the perplexity, or the accuracy
    then the coverage. None where the row has no value."""
    if row is None:
        return None
    if lower_is_better:
        return None if row["ppl"] is None else -row["ppl"]
    return (row["accuracy"], row["coverage"])


def ranked(rows, lower_is_better, leave_out):
    """[(score, policy)] best first; equal scores keep the registry's order (a stable sort)."""
    out = [(score(r, lower_is_better), p) for p, r in rows.items()
           if p not in leave_out and score(r, lower_is_better) is not None]
    out.sort(key=lambda sp: sp[0], reverse=True)
    return out


def main_value(row, lower_is_better):
    if lower_is_better:
        return "n/a" if row["ppl"] is None else f"{row['ppl']:.2f}"
    return f"{row['accuracy']:.3f} / {row['coverage']:.3f}"


def cell(row, lower_is_better, bold):
    value = main_value(row, lower_is_better)
    if bold:
        value = f"**{value}**"
    hit = "n/a" if row.get("hit_rate") is None else f"{row['hit_rate']:.2f}"
    return f"{value} (eff {row['effective_sparsity']:.2f}, hit {hit})"


def policy_order(per_sparsity):
    order = []
    for entry in per_sparsity.values():
        for policy in entry["rows"]:
            if policy not in order:
                order.append(policy)
    # dense first (the reference), then the oracle (the bound), then the registry's order.
    return sorted(order, key=lambda p: (p != REFERENCE, p != ORACLE))


def task_section(task, title, measure, lower_is_better, per_sparsity):
    sparsities = sorted(per_sparsity)
    lines = [f"### {title}", ""]
    some = next((e["doc"] for e in per_sparsity.values() if "doc" in e), None)
    first = next(iter(some["results"]), None) if some else None
    if task in ("wikitext2", "c4") and first:
        lines.append(f"Cells: {measure} (lower is better) over {first['tokens_scored']} predicted "
                     f"tokens in windows of {first['window']}, with the effective sparsity and the "
                     "mean top-50% hit rate of the policy's scores against the true attention "
                     "logits; **bold**: the best policy of the column (dense and the oracle "
                     "aside).")
    elif first:
        lines.append(f"Cells: {measure} (higher is better) over {first['samples']} samples, with "
                     "the effective sparsity and the mean top-50% hit rate; **bold**: the best "
                     "accuracy of the column (dense and the oracle aside).")
    lines.append("")
    lines.append("| policy | " + " | ".join(f"{s:.0%}" for s in sparsities) + " |")
    lines.append("| --- | " + " | ".join("---" for _ in sparsities) + " |")
    best = {}
    for s in sparsities:
        contenders = ranked(per_sparsity[s]["rows"], lower_is_better, (REFERENCE, ORACLE))
        if contenders:
            best[s] = {p for v, p in contenders if v == contenders[0][0]}
    for policy in policy_order(per_sparsity):
        cells = []
        for s in sparsities:
            entry = per_sparsity[s]
            row = entry["rows"].get(policy)
            if entry["status"] != 0:
                cells.append("failed")
            elif row is None:
                cells.append("-")
            elif policy == REFERENCE:
                cells.append(main_value(row, lower_is_better))
            else:
                cells.append(cell(row, lower_is_better, policy in best.get(s, ())))
        name = f"{policy} (reference)" if policy == REFERENCE else policy
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Order (best first, `=` for a tie; dense aside, the oracle in brackets"
                 + ("; by accuracy, then coverage):" if not lower_is_better else "):"))
    lines.append("")
    for s in sparsities:
        order = ranked(per_sparsity[s]["rows"], lower_is_better, (REFERENCE,))
        text = ""
        for i, (value, policy) in enumerate(order):
            name = f"[{policy}]" if policy == ORACLE else policy
            shown = main_value(per_sparsity[s]["rows"][policy], lower_is_better).replace(" ", "")
            if i:
                text += " = " if value == order[i - 1][0] else " > "
            text += f"{name} {shown}"
        lines.append(f"- {s:.0%}: " + (text or "(no results)"))
    failed = [(s, e) for s, e in sorted(per_sparsity.items()) if e["status"] != 0]
    for s, e in failed:
        lines.append(f"- {s:.0%} failed (exit {e['status']}): {last_line(e['log'])} "
                     f"(log {os.path.basename(e['log'])})")
    lines.append("")
    return lines


def summary(results, sparsity=0.5):
    """One table at one sparsity: a row per policy, a column per task's main score, and the hit
    rate on WikiText-2 (the policy's ranking quality does not depend much on the task)."""
    tasks = [(t, title, lower) for t, title, _, lower in TASKS
             if sparsity in results.get(t, {}) and results[t][sparsity]["status"] == 0]
    if not tasks:
        return []
    short = {"wikitext2": "WikiText-2 ppl", "c4": "C4 ppl", "coref": "coref acc.",
             "coref_paper": "paper coref acc."}
    hit_task = next((t for t, _, _ in tasks), None)
    policies = policy_order({t: results[t][sparsity] for t, _, _ in tasks})
    lines = [f"### At {sparsity:.0%} sparsity", "",
             "| policy | " + " | ".join(short[t] for t, _, _ in tasks) +
             f" | effective sparsity | hit rate ({short[hit_task].split()[0]}) |",
             "| --- |" + " --- |" * (len(tasks) + 2)]
    for policy in policies:
        cells = []
        for task, _, lower in tasks:
            row = results[task][sparsity]["rows"].get(policy)
            if row is None:
                cells.append("-")
            elif lower:
                cells.append("n/a" if row["ppl"] is None else f"{row['ppl']:.2f}")
            else:
                cells.append(f"{row['accuracy']:.3f}")
        row = results[hit_task][sparsity]["rows"].get(policy)
        eff = "-" if row is None else f"{row['effective_sparsity']:.2f}"
        hit = "n/a" if row is None or row.get("hit_rate") is None else f"{row['hit_rate']:.3f}"
        lines.append(f"| {policy} | " + " | ".join(cells) + f" | {eff} | {hit} |")
    lines.append("")
    return lines


def tables(runs, out_path):
    facts = read_facts(runs)
    results = read_runs(runs)
    if not results:
        raise SystemExit(f"{runs}: no *.time files (tools/real_model_results.sh writes them)")
    model = facts.get("model", "?")
    lines = [f"## Results on {os.path.basename(model.rstrip('/'))}", ""]
    lines.append(
        "Every policy at each sparsity in one lockstep `kvlens-cli eval --hit-rate` per task and "
        "sparsity (decode simulation: every step under the policy). Effective sparsity: the share "
        "of the candidates each (step, layer, head) did not see, averaged. Hit rate: the "
        "TokenButler paper's top-50% agreement of the policy's scores with the true attention "
        "logits (each step's query row), averaged over every (step, layer, head) the policy "
        "scored; n/a where it scored none (dense, or a policy whose layers were all gated)."
    )
    lines.append("")
    lines += summary(results)
    for task, title, measure, lower in TASKS:
        if task in results:
            lines += task_section(task, title, measure, lower, results[task])
        elif task == "coref_paper":
            lines += [f"### {title}", "",
                      "Not run: no `--paper-pools` file was given (mrcr_custom.json from the "
                      "TokenButler repository; it is not committed).", ""]
    lines += ["### How these were made", ""]
    for key, label in (("model", "Model"), ("predictor", "Predictor"), ("backend", "Backend"),
                       ("kvlens", "kvlens"), ("host", "Machine"), ("cpu", "CPU"),
                       ("cores", "Cores"), ("memory_gb", "Memory (GB)"), ("gpu", "GPU"),
                       ("jobs", "Processes at once"), ("threads", "Threads per process"),
                       ("samples", "Co-reference samples (bundled pools)"),
                       ("paper_samples", "Co-reference samples (paper's pools)"),
                       ("ppl_tokens", "Perplexity tokens"),
                       ("window", "Perplexity window"), ("started", "Started")):
        if facts.get(key):
            lines.append(f"- {label}: {facts[key]}")
    if "seconds" in facts:
        # With --resume the last invocation ran only some evals: give both figures.
        total = sum(e["seconds"] for per in results.values() for e in per.values())
        lines.append(f"- Wall time of the last invocation: {int(facts['seconds'])} s; "
                     f"the evals' own times add up to {total:.0f} s")
    lines.append("")
    sparsities = sorted({s for per in results.values() for s in per})
    lines.append("Seconds per eval (all policies of one sparsity in lockstep):")
    lines.append("")
    lines.append("| task | " + " | ".join(f"{s:.0%}" for s in sparsities) + " |")
    lines.append("| --- | " + " | ".join("---" for _ in sparsities) + " |")
    for task, _, _, _ in TASKS:
        if task in results:
            lines.append(f"| {task} | " + " | ".join(
                f"{results[task][s]['seconds']:.0f}" if s in results[task] else "-"
                for s in sparsities) + " |")
    lines.append("")
    if facts.get("command"):
        lines += ["Made with:", "", "```sh", facts["command"].strip(), "```", ""]
    commands_path = os.path.join(runs, "commands.tsv")
    if os.path.exists(commands_path):
        lines += ["which ran these evals (kvlens-cli):", "", "```sh"]
        with open(commands_path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) > 2:
                    lines.append("kvlens-cli " + " ".join(shlex.quote(a) for a in fields[2:]))
        lines += ["```", ""]
    with open(out_path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tables", help="write the markdown from a runs folder")
    t.add_argument("--runs", required=True)
    t.add_argument("--out", required=True)
    q = sub.add_parser("policies", help="the policy ids to run, comma-separated")
    q.add_argument("--registry", required=True, help="`kvlens-cli policies --json` output")
    q.add_argument("--have-predictor", type=int, choices=(0, 1), required=True)
    q.add_argument("--only", default="")
    args = p.parse_args(argv)
    if args.command == "policies":
        print(",".join(select_policies(args.registry, args.have_predictor, args.only)))
    else:
        tables(args.runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
