#!/usr/bin/env python3
"""RocketKV's parity fixture (tests/fixtures/rocketkv/reference.json): the budget split and stage
2's page estimate and top-k, computed the way the authors' code computes them, re-implemented
here line by line in plain Python (float64; the authors' code needs torch and a CUDA gpt-fast
set-up) from NVlabs/RocketKV, gpt-fast/rocket.py:

  get_params_for_token_budget   lines 120-133: ratio, alpha, capacity, chunk size, r, k
  RocketKVCache.update          lines 326-349 (LAST_PREFILL): element-wise min and max of the
                                kept keys per chunk of `chunk_size` slots (the last chunk padded
                                with +inf / -inf); lines 364-370 (DECODE) fold a new key into its
                                chunk, which gives the same summaries
  rocket_attn                   lines 395-413: top-r channels of |q| summed over the KV group
                                (397), the max or min per channel by the sign of the group's
                                summed q (399-400), q_hat . k_hat repeated over each chunk's
                                tokens (401-402), the sqrt(D * l1(q_hat) / l1(q)) scale (404-408),
                                softmax (409), summed over the group's heads and top-k (412-413)

Random queries and keys at the policy harness' shape (4 query heads over 2 KV heads, D = 4, 12
cached tokens, the last the current one), every token kept by stage 1 (kvlens at sparsity 0.3
keeps all 12 at step 11), chunks of 2, r = 2, and k = the budget's other tokens (kvlens's
current token is always visible; the authors' mask has it among the k). Written: the approximate
logits per head (q_hat . k_hat / scale, before the softmax), the top-k per head (the authors'
code with one query head per KV head: a softmax is monotone, so the top-k of the estimate) and
per KV group (the softmaxes summed over the group's heads, the authors' GQA rule), and the split
for a grid of sparsities and head dims. Run: python3 tools/make_rocketkv_fixture.py
(deterministic: seed 11); tests/unit/test_rocketkv_parity.cpp reads the file.
"""

import argparse
import json
import math
import os
import random
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "rocketkv", "reference.json")
H, G, D, T = 4, 2, 4, 12  # query heads, KV heads, head_dim, cached tokens (the last is current)
CHUNK, R = 2, 2
SPARSITY = 0.3
KEEP = math.ceil((1 - SPARSITY) * T - 1e-9) - 1  # kvlens's B(t) less the current token


def get_params_for_token_budget(token_budget, sequence_length, max_new_tokens, head_dim):
    """rocket.py lines 120-133, statement by statement."""
    token_budget = min(sequence_length, token_budget)
    compression_ratio = max(1.0, float(sequence_length) / token_budget)
    alpha = min(0.2 + math.log2(compression_ratio) * 0.06, 0.8)
    capacity_budget = int(float(sequence_length) / (compression_ratio ** alpha))
    prompt_budget = min(sequence_length - max_new_tokens, capacity_budget - max_new_tokens)
    k = min(round(token_budget / 2), capacity_budget)
    compression_ratio = max(1.0, float(capacity_budget) / token_budget)
    chunk_size = min(math.floor(compression_ratio), math.ceil(math.sqrt(compression_ratio)))
    r = min(head_dim, max(1, round(head_dim * chunk_size / compression_ratio)))
    return capacity_budget, prompt_budget, chunk_size, r, k


def chunk_min_max(keys, chunk):
    """update(), LAST_PREFILL, lines 328-349: per chunk and channel the min and the max, the
    last chunk padded with +inf (min) and -inf (max)."""
    lo, hi = [], []
    for start in range(0, len(keys), chunk):
        part = keys[start:start + chunk]
        lo.append([min(key[c] for key in part) for c in range(D)])
        hi.append([max(key[c] for key in part) for c in range(D)])
    return lo, hi


def top_indices(values, count):
    """torch.topk's set. The tokens of one chunk share a score; torch.topk leaves the order of
    ties unspecified, so they go to the more recent token here, kvlens's rule."""
    order = sorted(range(len(values)), key=lambda j: (-values[j], -j))
    return sorted(order[:count])


def rocket_stage2(q, keys):
    """rocket_attn lines 395-413 for one decode step; returns the estimate per head (the
    softmax's input divided by its scale) and the top-k per head and per KV group."""
    group = H // G
    estimate = [[0.0] * T for _ in range(H)]
    per_group = []
    for g in range(G):
        heads = range(g * group, (g + 1) * group)
        lo, hi = chunk_min_max(keys[g], CHUNK)
        # line 397: top-r of |q| summed over the group's heads (ties: the lower channel)
        magnitude = [sum(abs(q[h][c]) for h in heads) for c in range(D)]
        channels = sorted(sorted(range(D), key=lambda c: (-magnitude[c], c))[:R])
        # line 399: the max where the group's summed q_hat is positive, else the min
        reads_max = [sum(q[h][c] for h in heads) > 0 for c in channels]
        probs_sum = [0.0] * T
        for h in heads:
            # lines 404-408: sqrt(D * l1(q_hat) / l1(q))
            scale = math.sqrt(D * sum(abs(q[h][c]) for c in channels) /
                              sum(abs(x) for x in q[h]))
            for j in range(T):
                p = j // CHUNK  # line 402: the chunk's score repeated over its tokens
                bound = [hi[p][c] if up else lo[p][c] for c, up in zip(channels, reads_max)]
                estimate[h][j] = sum(q[h][c] * b for c, b in zip(channels, bound)) / scale
            # line 409: softmax over the tokens
            top = max(estimate[h])
            weights = [math.exp(x - top) for x in estimate[h]]
            total = sum(weights)
            for j in range(T):
                probs_sum[j] += weights[j] / total
        # lines 412-413: summed over the group's heads, top-k (kvlens: the current token + KEEP)
        per_group.append(sorted(top_indices(probs_sum[:-1], KEEP) + [T - 1]))
    per_head = [sorted(top_indices(estimate[h][:-1], KEEP) + [T - 1]) for h in range(H)]
    return estimate, per_head, per_group


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=OUT, help="the fixture file (default: the committed one)")
    out = p.parse_args(argv).out
    rng = random.Random(11)
    q = [[f32(rng.gauss(0, 1)) for _ in range(D)] for _ in range(H)]
    keys = [[[f32(rng.gauss(0, 1)) for _ in range(D)] for _ in range(T)] for _ in range(G)]
    estimate, per_head, per_group = rocket_stage2(q, keys)
    # The split as a ratio: a long sequence (2^20 tokens, no new ones) at each sparsity.
    splits = []
    n = 1 << 20
    for sparsity in (0.3, 0.5, 0.7, 0.9):
        for head_dim in (32, 64, 128):
            capacity, _, chunk, r, _ = get_params_for_token_budget(
                round(n * (1 - sparsity)), n, 0, head_dim)
            splits.append({"sparsity": sparsity, "head_dim": head_dim,
                           "capacity_share": capacity / n, "chunk_size": chunk, "r": r})
    fixture = {
        "about": "tools/make_rocketkv_fixture.py: NVlabs/RocketKV rocket.py re-implemented",
        "heads": H, "kv_heads": G, "head_dim": D, "tokens": T, "chunk_size": CHUNK, "r": R,
        "sparsity": SPARSITY, "keep_others": KEEP,
        "q": [x for row in q for x in row],
        "k": [x for group in keys for key in group for x in key],
        "scores": [x for row in estimate for x in row],
        "kept_per_head": per_head, "kept_per_kv_head": per_group, "splits": splits,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
