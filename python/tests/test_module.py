"""The kvlens module: a session stepped from Python records what kvlens-cli trace records (every
row array equal), arrays are views with the right shapes, .kvtrace files round-trip, figures
are the bytes kvlens-cli figure writes."""
import os
import time

import numpy as np

from common import CLI, DEMO, SCRATCH, check, cli, kvlens

POLICIES, SPARSITY, SAMPLE = "dense,h2o,quest,tokenbutler", 0.5, 3

model = kvlens.Model(DEMO)
config = model.config
L, H = config["layers"], config["heads"]
check(model.has_predictor, "the demo model has its predictor")
ids = model.tokenize("The place is: Paris.")
check(model.decode(ids, True).strip() == "The place is: Paris.", "tokenize / decode")

session = kvlens.Session(model, policies=POLICIES, sparsity=SPARSITY, coref_sample=SAMPLE)
check(len(session.runs) == 4, "one run per policy")
seconds = []
while True:
    start = time.perf_counter()
    if not session.step():
        break
    seconds.append(time.perf_counter() - start)
    t = session.step_count - 1
    rows = session.rows(run=1)
    check(rows.step == t and rows.logits.shape == (L, H, t + 1), f"step {t}: {rows.logits.shape}")
    check(rows.visible.dtype == np.bool_ and rows.scores.dtype == np.float32, "dtypes")
    out = session.output_logits(run=1)
    check(out.shape == (config["vocab_size"],) and int(np.argmax(out)) == rows.argmax,
          f"step {t}: output logits' argmax {np.argmax(out)} vs {rows.argmax}")
print(f"session: {session.step_count} steps of {len(session.runs)} runs, "
      f"median {1e3 * np.median(seconds):.2f} ms a step (CPU, stepped from Python)")
check(session.done and session.step_count == session.steps_total, "stepped to the end")

# Views, not copies: the arrays share the trace's memory and cannot be written.
rows = session.rows(run=1, step=-1)
check(not rows.logits.flags.owndata and not rows.logits.flags.writeable, "a read-only view")
check(np.shares_memory(rows.logits, session.rows(run=1, step=-1).logits), "the same memory")
probs = rows.probabilities
masked = [l for l, d in enumerate(rows.decisions) if d == "masked"]
check(masked, "h2o masks layers")
check(np.allclose(probs.sum(axis=-1), 1.0, atol=1e-5), "probabilities sum to 1")
check(np.all(probs[masked][~rows.visible[masked]] == 0), "no probability outside the set")

# kvlens-cli trace records the same rows.
path = os.path.join(SCRATCH, "cli.kvtrace")
cli("trace", "--model", DEMO, "--coref-sample", SAMPLE, "--policies", POLICIES, "--sparsity",
    SPARSITY, "--out", path)
reference = kvlens.load_trace(path)
check(reference.step_count == session.step_count, "as many steps")
check(reference.runs == session.trace.runs, f"runs {reference.runs} vs {session.trace.runs}")
check(reference.coref == session.trace.coref, "co-reference markers")
check(np.array_equal(reference.token_ids, session.trace.token_ids), "tokens")
for t in range(reference.step_count):
    for r in range(len(reference.runs)):
        a, b = reference.rows(t, r), session.rows(run=r, step=t)
        for field in ("logits", "scores", "visible", "visible_counts"):
            check(np.array_equal(getattr(a, field), getattr(b, field),
                                 equal_nan=field in ("logits", "scores")),
                  f"step {t} run {r}: {field} differs from kvlens-cli trace")
        check(a.top_ids == b.top_ids and a.decisions == b.decisions, f"step {t} run {r}: top-k")
        ma, mb = a.metrics, b.metrics
        check(all((ma[k] == mb[k]) or (ma[k] != ma[k] and mb[k] != mb[k]) for k in ma),
              f"step {t} run {r}: metrics {ma} vs {mb}")
print(f"rows equal to kvlens-cli trace: {reference.step_count} steps x {len(reference.runs)} runs")

# Save / load round trip; figures as kvlens-cli figure draws them.
mine = os.path.join(SCRATCH, "python.kvtrace")
session.save(mine)
loaded = kvlens.load_trace(mine)
check(np.array_equal(loaded.rows(-1, 2).scores, session.rows(run=2).scores, equal_nan=True),
      "round trip")
if kvlens.has_figures:
    for view in ("heads", "retention", "logits"):
        a, b = os.path.join(SCRATCH, f"py-{view}.png"), os.path.join(SCRATCH, f"cli-{view}.png")
        kvlens.figure(loaded, a, view=view, runs="0,1")
        cli("figure", "--trace", path, "--view", view, "--runs", "0,1", "--out", b)
        check(open(a, "rb").read() == open(b, "rb").read(), f"{view}: the same PNG as the CLI")
    print("figures: the same PNG bytes as kvlens-cli figure (heads, retention, logits)")

try:
    kvlens.Session(model, policies="nope", coref_sample=0)
    raise AssertionError("an unknown policy is an error")
except kvlens.Error as error:
    check("nope" in str(error), str(error))
print("ok")
