"""H2O written with torch: the rule of examples/policies/h2o.py (and of the built-in h2o) on
torch tensors. On a CUDA session the step's buffers arrive as CUDA tensors through DLPack (no
copies) and the work runs on the session's stream; on the CPU they are torch views of the host
buffers.

    kvlens-cli eval --backend cuda --model assets/models/demo --task coref \
        --policy-file examples/policies/h2o_torch.py --policies h2o_torch,h2o --sparsity 0.5
"""
import math

import torch

import kvlens


class H2OTorch(kvlens.Policy):
    """Keeps the most recent tokens and the heavy hitters by accumulated attention (H2O, in
    torch): each head sums the softmax attention every cached token received, as computed under
    each step's visible set; the budget B keeps the recent B - floor(heavy_frac * B) tokens and
    the best sums among the rest; an evicted token never returns and its sum is forgotten."""

    name = "h2o_torch"
    family = "eviction (H2O, torch)"
    params = {"heavy_frac": kvlens.Float(0.5, 0.0, 1.0, "Fraction of the budget for heavy hitters")}
    needs = {"probabilities", "eligible"}
    tensors = "torch"

    def __init__(self, shape, **params):
        super().__init__(shape, **params)
        self.device = "cuda" if shape.memory == "cuda" else "cpu"
        self.accumulated, self.kept = {}, {}
        self.sinks = 0

    def _state(self, layer, rows, cols):
        acc = self.accumulated.get(layer)
        if acc is None or acc.shape[1] < cols:
            capacity = max(256, 2 * (acc.shape[1] if acc is not None else 0), cols)
            grown = torch.zeros((self.shape.heads, capacity), dtype=torch.float32,
                                device=self.device)
            kept = torch.ones((rows, capacity), dtype=torch.bool, device=self.device)
            if acc is not None:
                grown[:, :acc.shape[1]] = acc
                kept[:, :acc.shape[1]] = self.kept[layer]
            self.accumulated[layer], self.kept[layer] = grown, kept
        return self.accumulated[layer], self.kept[layer]

    def select(self, step):
        cols = step.cols
        acc, kept = self._state(step.layer, step.selection_rows, cols)
        self.sinks = step.sinks
        step.recent = max(step.budget - math.floor(self.heavy_frac * step.budget), step.window)
        step.scores.copy_(acc[:, :cols])
        step.eligible.copy_(kept[:, :cols])
        return kvlens.SCORES

    def observe(self, obs):
        cols = obs.cols
        acc, kept = self.accumulated[obs.layer], self.kept[obs.layer]
        rows = kept.shape[0]
        visible = obs.visible
        kept[:, :cols] &= visible[::visible.shape[0] // rows]
        kept[:, :min(self.sinks, cols)] = True
        probs = obs.probabilities
        if rows == acc.shape[0]:
            acc[:, :cols] = torch.where(kept[:, :cols], acc[:, :cols], 0.0) + probs
        else:
            acc[:, :cols] += probs
