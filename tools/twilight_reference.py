#!/usr/bin/env python3
"""Twilight's pruning parity fixture (tests/fixtures/twilight/reference.json): random estimated
logits and base selections, pruned the way the authors' code prunes, re-implemented here line by
line in plain Python (float64; their kernel runs in float32) from tsinghua-ideal/Twilight at
843ebcc:

  twilight/pyimpl/attention.py   attention_forward, lines 255 and 267-281: the estimates of
                                 tokens the selector did not pick set to the dtype's lowest
                                 value, top_p_unnormalized, then mask = selector & pruner
  twilight/pyimpl/top_p.py       top_p_unnormalized: softmax in float32, then the kernel
  csrc/include/sampling.cuh      TopPReturnMaskKernel, lines 121-228: low = 0 and high = the
                                 row's first probability, bisection on mid = (low + high) / 2
                                 while max_le_high - min_gt_low > 1e-5, keep probs > low

The kernel starts its bisection from the first column's probability (the attention sink in a real
model): where column 0 is not the row's largest, its invariant f(high) < p does not hold. Rows of
both kinds are written, with `sink_is_max` telling them apart, and `clear` marking rows whose kept
set cannot move with the rounding of float32 against float64 (probability gaps and the mass
margin at the threshold above 1e-4). tests/unit/test_twilight_policy.cpp compares kvlens's
top_p_prune on the same rows. Run: python3 tools/twilight_reference.py (deterministic: seed 11).
"""

import argparse
import json
import math
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "twilight", "reference.json")
COLS = 24
F32_LOWEST = -3.4028234663852886e38
EPS = 1e-5


def softmax(values):
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


def top_p_return_mask(probs, p):
    """TopPReturnMaskKernel for one row (lines 121-228)."""
    low, high = 0.0, probs[0]
    while True:
        mid = (low + high) / 2
        min_gt_low, max_le_high = high, low
        total = 0.0
        for x in probs:
            if x > mid:
                total += x
            if x > low:
                min_gt_low = min(min_gt_low, x)
            if x <= high:
                max_le_high = max(max_le_high, x)
        if total >= p:
            low = mid
        else:
            high = min(mid, max_le_high)
        if not (max_le_high - min_gt_low > EPS):
            break
    return [1 if x > low else 0 for x in probs]


def twilight_row(scores, selected, p):
    """attention_forward's estimator masking and pruning (lines 255, 267-281)."""
    estimated = [s if keep else F32_LOWEST for s, keep in zip(scores, selected)]
    pruned = top_p_return_mask(softmax(estimated), p)
    return [a & b for a, b in zip(selected, pruned)]


def clear_margin(scores, selected, p):
    """Whether the kept set is the same under any rounding below 1e-4: the candidates' masses
    in rank order never sit within 1e-4 of p, and neighbouring probabilities differ by more."""
    probs = softmax([s if keep else F32_LOWEST for s, keep in zip(scores, selected)])
    ranked = sorted((x for x, keep in zip(probs, selected) if keep), reverse=True)
    taken = 0.0
    for a, b in zip(ranked, ranked[1:] + [0.0]):
        taken += a
        if abs(taken - p) < 1e-4 or abs(a - b) < 1e-4:
            return False
        if taken >= p:
            return True
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    rng = random.Random(11)
    rows = []
    for i in range(96):
        p = [0.5, 0.85, 0.95][i % 3]
        scale = [1.0, 3.0, 6.0][(i // 3) % 3]
        scores = [round(rng.gauss(0.0, scale), 4) for _ in range(COLS)]
        selected = [1 if rng.random() < 0.6 else 0 for _ in range(COLS)]
        sink_first = i % 4 != 3
        if sink_first:  # the sink selected and the row's largest, as in a real model
            selected[0] = 1
            scores[0] = round(max(scores) + abs(rng.gauss(1.0, 1.0)), 4)
        probs = softmax([s if k else F32_LOWEST for s, k in zip(scores, selected)])
        rows.append({
            "scores": scores,
            "selected": selected,
            "top_p": p,
            "kept": twilight_row(scores, selected, p),
            "sink_is_max": probs[0] >= max(probs),
            "clear": clear_margin(scores, selected, p),
        })
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cols": COLS, "rows": rows}, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
