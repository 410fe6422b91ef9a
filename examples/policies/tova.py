"""A TOVA variant (Oren et al., 2024, "Transformers are Multi-State RNNs") written in Python.

It ranks by this step's attention and evicts before attending; the built-in `tova` follows the
authors' cache, which attends first and evicts by that attention for the next step.

    kvlens-cli eval --model assets/models/demo --task coref --policy-file examples/policies/tova.py \
        --policies tova_py,tova,h2o --sparsity 0.5 --samples 50
"""
import numpy as np

import kvlens


class Tova(kvlens.Policy):
    """TOVA: at each step, while a layer's cache holds more than the budget, evict the cached
    token with the lowest attention from the current query, averaged over the layer's heads;
    evicted tokens never return. Every head of a layer sees the same tokens; the current token
    and the first `sinks` tokens are never evicted (while the budget is below them, the last
    sinks are hidden)."""

    name = "tova_py"
    family = "eviction (TOVA, Python)"
    needs = {"logits"}

    def __init__(self, shape, **params):
        super().__init__(shape, **params)
        self.cached = {}  # layer -> bool [capacity]: the layer's cache (not evicted)

    def select(self, step):
        t, cols, budget = step.step, step.cols, step.budget
        cached = self.cached.get(step.layer)
        if cached is None or cached.shape[0] < cols:
            grown = np.ones(max(256, 2 * cols), bool)
            if cached is not None:
                grown[:cached.shape[0]] = cached
            cached = self.cached[step.layer] = grown
        keep = cached[:cols]
        keep[t] = True
        # The current query's attention over the cache, per head, averaged over the heads.
        logits = np.where(keep, step.logits, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        attention = probs.mean(axis=0)
        step.scores[...] = attention
        sinks = min(step.sinks, t)
        excess = int(keep.sum()) - budget
        if excess > 0:
            candidates = np.flatnonzero(keep)
            candidates = candidates[(candidates >= sinks) & (candidates != t)]
            order = np.argsort(attention[candidates], kind="stable")
            keep[candidates[order[:excess]]] = False
        visible = step.visible
        visible[...] = keep
        if excess > 0 and int(keep.sum()) > budget:
            # A budget smaller than the sinks and the current token: the last sinks are hidden
            # at this step (not evicted: they are seen again once the budget allows).
            visible[:, max(budget - 1, 0):sinks] = False
        return kvlens.VISIBLE
