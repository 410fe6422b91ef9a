# %% [markdown]
# # A new KV-cache policy in a few lines, compared with H2O and TokenButler
#
# Cells are marked `# %%` (VS Code, Jupyter's jupytext, Spyder run them one by one); the file also
# runs as a script: `PYTHONPATH=build/python python3 examples/notebook_compare.py`.
# `KVLENS_NOTEBOOK_SAMPLES` sets the co-reference samples (default 50) and
# `KVLENS_NOTEBOOK_OUT` the folder the figure goes to (default `notebook-out`).

# %%
import os
import time

import numpy as np

import kvlens

SAMPLES = int(os.environ.get("KVLENS_NOTEBOOK_SAMPLES", "50"))
OUT = os.environ.get("KVLENS_NOTEBOOK_OUT", "notebook-out")
SPARSITY = 0.5
model = kvlens.Model(kvlens.demo_model())  # the bundled 7.9M-parameter Llama and its predictor
print(model, model.config)


# %% [markdown]
# The policy: its docstring is its rule (kvlens lists it with it). `select(step)` gets the step's
# buffers as NumPy views; returning scores [heads, cols] lets kvlens apply the budget, the sinks
# and the recent window, as it does for every built-in.

# %%
class GroupMeanLogits(kvlens.Policy):
    """Ranks the cached tokens by this step's true attention logits averaged over the query
    heads that share a KV head, so every head of a KV group keeps the same tokens."""

    name = "group_mean"
    family = "query-aware (notebook)"
    needs = {"logits"}

    def select(self, step):
        heads, groups = self.shape.heads, self.shape.kv_heads
        logits = step.logits.reshape(groups, heads // groups, step.cols)
        return np.repeat(logits.mean(axis=1), heads // groups, axis=0)


kvlens.register_policy(GroupMeanLogits)
print([p["id"] for p in kvlens.policies()])

# %% [markdown]
# The co-reference task (the TokenButler paper's), every policy in one lockstep session per
# sample: the same numbers as `kvlens-cli eval --task coref`.

# %%
start = time.perf_counter()
results = kvlens.eval_coref(model, policies="dense,group_mean,h2o,tokenbutler",
                            sparsity=SPARSITY, samples=SAMPLES)
kvlens.table(results)
print(f"{time.perf_counter() - start:.1f} s for {SAMPLES} samples")

# %% [markdown]
# One sample stepped by hand: the arrays of each step, then a figure of which tokens each policy
# kept (the app's retention view, as `kvlens-cli figure` draws it).

# %%
session = kvlens.Session(model, policies="group_mean,h2o", sparsity=SPARSITY, coref_sample=0)
while session.step():
    pass
rows = session.rows(run=0)
print("last step:", rows.step, "logits", rows.logits.shape, "visible per head",
      rows.visible.sum(axis=-1)[1])
os.makedirs(OUT, exist_ok=True)
if kvlens.has_figures:
    figure = kvlens.figure(session, os.path.join(OUT, "retention.png"), view="retention",
                           runs="0,1")
    print("figure:", figure["out"])
session.save(os.path.join(OUT, "sample0.kvtrace"))
