"""H2O written in Python: the rule of engine/policy/h2o_policy.cpp through the plug-in contract.

    kvlens-cli eval --model assets/models/demo --task coref --policy-file examples/policies/h2o.py \
        --policies h2o_py,h2o --sparsity 0.5 --samples 50

gives the same visible sets, and so the same accuracy, as the built-in h2o.
"""
import math

import numpy as np

import kvlens


class H2OPy(kvlens.Policy):
    """Keeps the most recent tokens and the heavy hitters by accumulated attention (H2O, in
    Python): each head sums the softmax attention every cached token received at every earlier
    step, as computed under that step's visible set; the budget B keeps the recent
    B - floor(heavy_frac * B) tokens and the best sums among the rest; an evicted token never
    returns and its sum is forgotten."""

    name = "h2o_py"
    family = "eviction (H2O, Python)"
    params = {"heavy_frac": kvlens.Float(0.5, 0.0, 1.0, "Fraction of the budget for heavy hitters")}
    needs = {"probabilities", "eligible"}

    def __init__(self, shape, **params):
        super().__init__(shape, **params)
        self.accumulated = {}  # layer -> float32 [heads, capacity]
        self.kept = {}         # layer -> bool [selection rows, capacity]: not evicted
        self.sinks = 0

    def _state(self, layer, rows, cols):
        acc = self.accumulated.get(layer)
        if acc is None or acc.shape[1] < cols:
            capacity = max(256, 2 * (acc.shape[1] if acc is not None else 0), cols)
            grown = np.zeros((self.shape.heads, capacity), np.float32)
            kept = np.ones((rows, capacity), bool)
            if acc is not None:
                grown[:, :acc.shape[1]] = acc
                kept[:, :acc.shape[1]] = self.kept[layer]
            self.accumulated[layer], self.kept[layer] = grown, kept
        return self.accumulated[layer], self.kept[layer]

    def select(self, step):
        cols = step.cols
        acc, kept = self._state(step.layer, step.selection_rows, cols)
        self.sinks = step.sinks
        heavy = math.floor(self.heavy_frac * step.budget)
        step.recent = max(step.budget - heavy, step.window)
        step.scores[...] = acc[:, :cols]
        step.eligible[...] = kept[:, :cols]
        return kvlens.SCORES

    def observe(self, obs):
        cols = obs.cols
        acc, kept = self.accumulated[obs.layer], self.kept[obs.layer]  # made by select()
        visible = obs.visible
        rows = kept.shape[0]
        # What is not visible now is evicted for good (the sinks stay eligible).
        kept[:, :cols] &= visible[::visible.shape[0] // rows]
        kept[:, :min(self.sinks, cols)] = True
        if rows == acc.shape[0]:
            # Evicted tokens' sums are forgotten: acc * kept + probabilities.
            np.add(np.where(kept[:, :cols], acc[:, :cols], np.float32(0)), obs.probabilities,
                   out=acc[:, :cols])
        else:  # one selection per KV head: evicted tokens never return anyway
            acc[:, :cols] += obs.probabilities
