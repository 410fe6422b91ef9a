"""Python policies through the C contract: examples/policies/h2o.py gives the built-in h2o's
visible sets and scores step by step in lockstep with it, in the module and in kvlens-cli
(--policy-file); tova runs within its budget; errors name the policy. Prints the Python
overhead per step (CPU, demo model)."""
import json
import os
import subprocess
import sys
import time

import numpy as np

from common import CLI, DEMO, SCRATCH, SOURCE_DIR, check, cli, kvlens

if not kvlens._core.has_plugin_adapter:
    print("skipped: this build has no plug-in adapter (engine/policy/plugin_policy.cpp)")
    sys.exit(4)

EXAMPLES = os.path.join(SOURCE_DIR, "examples", "policies")
H2O, TOVA = os.path.join(EXAMPLES, "h2o.py"), os.path.join(EXAMPLES, "tova.py")
check(kvlens.load_policy_file(H2O) == ["h2o_py"], "h2o.py defines h2o_py")
check(kvlens.load_policy_file(TOVA) == ["tova_py"], "tova.py defines tova_py")
ids = [p["id"] for p in kvlens.policies()]
check(len(ids) == len(set(ids)), f"each policy listed once: {ids}")
listed = {p["id"]: p for p in kvlens.policies()}
check(listed["h2o_py"]["description"].startswith("Keeps the most recent tokens"), "its docstring")
check([p["name"] for p in listed["h2o_py"]["params"]][-1] == "heavy_frac", "its knob")
check(listed["snapkv+adakv"]["composed"] and listed["h2o+pyramidkv"]["composed"],
      "the SCORER+ALLOCATOR ids are listed, marked composed")
check(not listed["h2o_py"]["composed"] and not listed["snapkv"]["composed"], "others are not")
model = kvlens.Model(DEMO)


def run(policies, sample, sparsity=0.5, args=None):
    session = kvlens.Session(model, policies=policies, sparsity=sparsity, coref_sample=sample,
                             policy_args=args)
    seconds = []
    while True:
        start = time.perf_counter()
        if not session.step():
            break
        seconds.append(time.perf_counter() - start)
    return session, seconds


# Lockstep with the built-in: the same sets and scores at every step, layer and head.
for sample, sparsity, args in ((0, 0.5, None), (1, 0.7, None), (2, 0.5, ["heavy_frac=0.25"]),
                               (3, 0.3, ["window=8", "sinks=2"]), (4, 0.5, ["granularity=kv_head"])):
    session, _ = run("h2o,h2o_py", sample, sparsity, args)
    for t in range(session.step_count):
        a, b = session.rows(run=0, step=t), session.rows(run=1, step=t)
        check(a.decisions == b.decisions, f"sample {sample} step {t}: decisions")
        check(np.array_equal(a.visible, b.visible),
              f"sample {sample} step {t}: visible sets differ "
              f"({np.argwhere(a.visible != b.visible)[:5].tolist()})")
        check(np.array_equal(a.scores, b.scores, equal_nan=True),
              f"sample {sample} step {t}: scores differ")
        check(a.top_ids == b.top_ids, f"sample {sample} step {t}: next-token top-k")
    print(f"sample {sample} (s={sparsity}, {args}): h2o_py = h2o at all {session.step_count} "
          "steps (visible sets, scores, top-k)")

# Built-in, C plug-in and Python policy in one lockstep session.
plugin = os.path.join(os.path.dirname(os.path.dirname(CLI)), "examples", "policies",
                      "libkvlens_h2o_c.so")
if os.path.exists(plugin):
    c_id = kvlens.load_plugin(plugin)
    session, _ = run(f"h2o,{c_id},h2o_py", 5)
    for t in range(session.step_count):
        rows = [session.rows(run=r, step=t).visible for r in range(3)]
        check(np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[2]),
              f"step {t}: h2o, {c_id} and h2o_py differ")
    print(f"h2o, {c_id} (C plug-in) and h2o_py in lockstep: the same sets at every step")

# TOVA in Python: within the budget, one set per layer, evicted tokens never return.
session, _ = run("tova_py", 0)
last = None
for t in range(session.step_count):
    rows = session.rows(run=0, step=t)
    for l, decision in enumerate(rows.decisions):
        if decision != "masked":
            continue
        check(np.all(rows.visible[l] == rows.visible[l, :1]), "every head sees the same tokens")
    if last is not None:
        sinks = 4  # always cached (hidden only while the budget is below them)
        check(not np.any(rows.visible[1:, 0, sinks:-1] & ~last[1:, 0, sinks:]),
              f"step {t}: a token returned")
        check(np.all(rows.visible[1:, :, :sinks]) or t < 12, f"step {t}: sinks kept")
    last = rows.visible
print("tova_py: one set per layer, no token returns")

# The Python overhead per step: the same session with a Python run against a built-in run.
class Scores(kvlens.Policy):
    """Ranks by this step's true logits (the oracle's scores), through Python."""
    name = "oracle_py"
    needs = {"logits"}

    def select(self, step):
        return step.logits


kvlens.register_policy(Scores)


class Inspect(kvlens.Policy):
    """Checks what select() is given: views over kvlens' buffers, inputs read-only."""
    name = "inspect_py"
    needs = {"logits", "eligible", "cache", "previous_visible"}
    seen = []

    def select(self, step):
        if step.step == 20 and step.layer == 3:
            logits = step.logits
            Inspect.seen.append({
                "view": not logits.flags.owndata and logits.base is not None,
                "inputs read-only": not logits.flags.writeable and not step.query.flags.writeable,
                "answers writable": step.scores.flags.writeable and step.eligible.flags.writeable,
                "shapes": (logits.shape, step.query.shape, step.keys.shape, step.eligible.shape,
                           step.layer_input.shape, step.previous_visible.shape),
                "dtypes": (str(logits.dtype), str(step.eligible.dtype), str(step.keys.dtype)),
            })
            Inspect.kept = step
        return step.logits


kvlens.register_policy(Inspect)
session, _ = run("inspect_py", 0)
seen = Inspect.seen[0]
H, G, D, E = (model.config[k] for k in ("heads", "kv_heads", "head_dim", "hidden_size"))
check(seen["view"] and seen["inputs read-only"] and seen["answers writable"], str(seen))
check(seen["shapes"] == ((H, 21), (H, D), (G, 21, D), (H, 21), (E,), (H, 21)), str(seen))
try:
    Inspect.kept.logits
    raise AssertionError("a step kept past its call must not be readable")
except ValueError as error:
    check("only valid during" in str(error), str(error))
print(f"select() is given views: {seen}")
for python_id, builtin in (("oracle_py", "oracle"), ("h2o_py", "h2o"), ("tova_py", "tova")):
    timings, steps = {}, 0
    for policies in (f"dense,{builtin}", f"dense,{python_id}"):
        kvlens._core._python_policy_stats(reset=True)
        medians = []
        for sample in range(3):
            session, seconds = run(policies, sample)
            medians.append(np.median(seconds))
            steps += session.step_count if python_id in policies else 0
        timings[policies] = float(np.median(medians))
    stats = kvlens._core._python_policy_stats(reset=True)
    base, mine = timings[f"dense,{builtin}"], timings[f"dense,{python_id}"]
    print(f"overhead: {python_id}: {1e3 * stats['seconds'] / steps:.3f} ms a step in Python "
          f"({stats['selects'] / steps:.0f} select + {stats['observes'] / steps:.0f} observe "
          f"calls, {1e6 * stats['seconds'] / max(1, stats['selects'] + stats['observes']):.1f} us "
          f"each, GIL included); step {1e3 * mine:.3f} ms against {1e3 * base:.3f} ms with "
          f"{builtin} (CPU, demo model, median step)")

# The answer buffers are not cleared between steps: what a policy leaves alone gets the
# defaults (a set answered without scores records zero scores); step.shared ranks one set for
# the whole layer.
class Recent(kvlens.Policy):
    """Sees the current token and the one before it, as a set."""
    name = "recent_py"

    def select(self, step):
        mask = np.zeros((self.shape.heads, step.cols), bool)
        mask[:, max(step.cols - 2, 0):] = True
        return kvlens.visible(mask)


class SharedLogits(kvlens.Policy):
    """One set per layer, ranked by the true logits summed over the heads."""
    name = "shared_py"
    needs = {"logits"}

    def select(self, step):
        step.shared = True
        return step.logits


kvlens.register_policy(Recent)
kvlens.register_policy(SharedLogits)
session, _ = run("recent_py", 1, 0.0)
other, _ = run("shared_py", 1, 0.9)
for t in range(2, session.step_count):
    a, b = session.rows(run=0, step=t), other.rows(run=0, step=t)
    check(np.all(a.visible_counts[1:] == 2) and np.all(a.scores[1:] == 0), f"step {t}: recent_py")
    check(np.all(b.visible[1:] == b.visible[1:, :1]), f"step {t}: shared_py, one set per layer")
print("a set answered without scores records zeros; step.shared gives one set per layer")

# In kvlens-cli: --policy-file, the same accuracy as the built-in.
out = os.path.join(SCRATCH, "eval.json")
cli("eval", "--model", DEMO, "--task", "coref", "--policy-file", H2O, "--policies", "h2o_py,h2o",
    "--sparsity", "0.5", "--samples", 20, "--json", out)
results = {r["policy"]: r for r in json.load(open(out))["results"]}
for key in ("accuracy", "coverage", "effective_sparsity", "effective_sparsity_per_layer"):
    check(results["h2o_py"][key] == results["h2o"][key], f"kvlens-cli: {key} differs")
print(f"kvlens-cli eval --policy-file h2o.py: h2o_py accuracy {results['h2o_py']['accuracy']} = "
      f"h2o {results['h2o']['accuracy']}")
# A file that imports no NumPy itself (the first arrays are then made on the engine's threads:
# this hung once), with a base class of its own that is not a policy.
plain = os.path.join(SCRATCH, "plain.py")
open(plain, "w").write(
    "import kvlens\n"
    "class Base(kvlens.Policy):\n"
    "    needs = {'logits'}\n"
    "class Neg(Base):\n"
    "    \"\"\"Ranks by minus the logits (a worst case).\"\"\"\n"
    "    name = 'neg_py'\n"
    "    def select(self, step):\n"
    "        return -step.logits\n")
done = subprocess.run([CLI, "eval", "--model", DEMO, "--task", "coref", "--policy-file", plain,
                       "--policies", "neg_py,h2o", "--sparsity", "0.5", "--samples", "8"],
                      capture_output=True, text=True, timeout=300)
check(done.returncode == 0 and "neg_py" in done.stdout, done.stderr)
print("kvlens-cli eval --policy-file: a file without NumPy, with a base class of its own")
listing = cli("policies", "--policy-file", TOVA)
check("tova_py" in listing and "lowest attention" in listing, "kvlens-cli policies lists tova_py")

# Errors name the policy.
class Broken(kvlens.Policy):
    """Fails at its first step."""
    name = "broken_py"

    def select(self, step):
        raise ValueError("no idea")


kvlens.register_policy(Broken)
try:
    run("broken_py", 0)
    raise AssertionError("a failing select is an error")
except kvlens.Error as error:
    check("broken_py" in str(error) and "no idea" in str(error), str(error))


class NoRule(kvlens.Policy):
    def select(self, step):
        return kvlens.DENSE


try:
    kvlens.register_policy(NoRule)
    raise AssertionError("a policy without a docstring is refused")
except ValueError as error:
    check("docstring" in str(error), str(error))
bad = os.path.join(SCRATCH, "bad.py")
open(bad, "w").write("import nonexistent_module\n")
done = subprocess.run([CLI, "policies", "--policy-file", bad], capture_output=True, text=True)
check(done.returncode != 0 and "bad.py" in done.stderr and "nonexistent_module" in done.stderr,
      done.stderr)
print("ok")
