#!/usr/bin/env python3
"""MagicPIG's parity fixture (tests/fixtures/magicpig/reference.json): one decode step's LSH
sample and importance weights computed the way the authors' code computes them, re-implemented
here line by line in plain Python (float64; their code needs a CUDA GPU, flashinfer and AVX-512
C++ extensions) from Infini-AI-Lab/MagicPIG at ac9aa36:

  models/attnserver.py
    __init__              line 55: one hash matrix torch.randn(head_dim, K * L) for every layer
                          and head; line 56: binary_pack = 2^i, i < K
    prefill (sparse)      lines 126-138: the first num_sink_tokens and the last num_local_tokens
                          keys stay exact on the GPU, the rest are offloaded; lines 159-167: an
                          offloaded key's code is (k @ hash_func > 0), reshaped to (L, K) (table
                          t is columns t*K .. t*K+K-1) and packed with binary_pack
    build_table           lines 173-187: per KV head and table the codes sorted, with their
                          token indices (the buckets LSH::fill indexes by start and end)
    decode (sparse)       lines 264-268: each attention head's query normalised, hashed and
                          packed the same way
  library/lsh/lsh.cc
    LSH::retrieve         lines 243-288: per table the query's bucket is walked; a token's
                          mask goes 0 -> 1 on its first hit and 1 -> 2 on its second, when it is
                          appended to the result (so: sampled when it shares the query's bucket
                          in at least 2 tables; the result is in order of second hits)
  library/sparse_attention/sparse_attention.cc
    transform_kernel      lines 164-184: for each sampled key, theta = acos(q.k / (|q| |k|)),
                          u = 1 - theta / pi, p = u^K, w = 1 - (1 - p)^(L-1) (L p + 1 - p), and
                          the logit q.k / sqrt(D) - log(w + 1e-4)

Two of the authors' steps are left out on purpose, as kvlens leaves them out (docs/policies/
magicpig.md, "Deliberate differences"): the keys are not centred (attnserver.py lines 142-145),
and the exact part is the sinks and the recent window of the step (not the prompt's last tokens
plus every generated one). The inputs are multiples of 1/64 (the hyperplanes Gaussian draws
rounded so), so every projection and dot product is exact in float32 and in float64: the codes,
and so the sampled sets, must agree exactly; the weights within the tolerance the test states.

Written, per configuration (K bits, L tables) and query head: the sampled token indices (sorted),
the authors' w for every offloaded token (the formula applied to all of them, so kvlens's scores
row can be checked on every column) and the authors' final logit of each sampled token.
Run: python3 tools/magicpig_reference.py (deterministic: seed 5);
tests/unit/test_magicpig_parity.cpp reads the file.
"""

import argparse
import json
import math
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "magicpig", "reference.json")
H, G, D, T = 4, 2, 16, 64  # query heads, KV heads, head_dim, cached tokens (the last: current)
SINKS, WINDOW = 4, 8  # the exact part: columns [0, SINKS) and [T - WINDOW, T)
CONFIGS = [(5, 24), (3, 12)]  # (K, L): about a fifth and a half of orthogonal keys sampled
GRID = 64.0  # every input is a multiple of 1 / GRID, within [-4, 4)


def on_grid(x):
    return max(-4.0, min(4.0 - 1.0 / GRID, round(x * GRID) / GRID))


def pack(row, k, tables):
    """attnserver.py lines 162-165: (x @ hash_func > 0), reshape(-1, K), mv with 2^i."""
    codes = []
    for t in range(tables):
        code = 0
        for b in range(k):
            if row[t * k + b] > 0:
                code += 2 ** b
        codes.append(code)
    return codes


def project(x, hash_func):
    """x @ hash_func: hash_func is [D, K * L] as the authors' (column c is one hyperplane)."""
    return [sum(x[d] * hash_func[d][c] for d in range(D)) for c in range(len(hash_func[0]))]


def build_tables(codes, tables):
    """build_table lines 173-187 (sort per table) and LSH::fill's buckets: per table a dict
    code -> the token indices in sorted order (start..end of the sorted content)."""
    buckets = []
    for t in range(tables):
        order = sorted(range(len(codes)), key=lambda i: (codes[i][t], i))
        table = {}
        for i in order:
            table.setdefault(codes[i][t], []).append(i)
        buckets.append(table)
    return buckets


def retrieve(query_codes, buckets, offloaded):
    """LSH::retrieve lines 243-288: the mask walk, appending on the second hit."""
    mask = [0] * offloaded
    result = []
    for i, q_i in enumerate(query_codes):
        for idx in buckets[i].get(q_i, []):
            if mask[idx] == 0:
                mask[idx] = 1
            elif mask[idx] == 1:
                mask[idx] = 2
                result.append(idx)
    return result


def transform(dot, q_norm, k_norm, k, tables):
    """transform_kernel lines 164-184 for one key: (w, logit)."""
    norm = q_norm * k_norm
    theta = math.acos(max(-1.0, min(1.0, dot / norm)))
    proba = 1 - theta / math.pi
    p = proba ** k
    q = 1 - p
    w = 1 - q ** (tables - 1) * (tables * p + q)
    return w, dot / math.sqrt(D) - math.log(w + 1e-4)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=OUT, help="the fixture file (default: the committed one)")
    out = parser.parse_args(argv).out
    rng = random.Random(5)
    q = [[on_grid(rng.gauss(0, 1)) for _ in range(D)] for _ in range(H)]
    keys = [[[on_grid(rng.gauss(0, 1)) for _ in range(D)] for _ in range(T)] for _ in range(G)]
    # The query heads of a group lean towards some of its keys, so the sample is not uniform.
    for h in range(H):
        g = h // (H // G)
        for j in rng.sample(range(SINKS, T - WINDOW), 3):
            q[h] = [on_grid(0.5 * a + b) for a, b in zip(q[h], keys[g][j])]
    offloaded = list(range(SINKS, T - WINDOW))  # token index of each offloaded slot
    configs = []
    for k, tables in CONFIGS:
        planes = [[on_grid(rng.gauss(0, 1)) for _ in range(k * tables)] for _ in range(D)]
        # One set of tables per KV head, as the authors build them (build_table's loop over KV
        # heads); its query heads all read it.
        group_buckets = [build_tables([pack(project(keys[g][j], planes), k, tables)
                                       for j in offloaded], tables) for g in range(G)]
        per_head = []
        for h in range(H):
            g = h // (H // G)
            buckets = group_buckets[g]
            # decode lines 265-268: the query normalised before hashing (the signs are the same)
            q_norm = math.sqrt(sum(x * x for x in q[h]))
            # An exactly zero projection would hash as 0 here but could round to either sign
            # once normalised: the example must have none (it has none at seed 5).
            if any(v == 0 for v in project(q[h], planes)):
                raise SystemExit("magicpig_reference.py: a query projection is exactly 0")
            query_codes = pack(project([x / q_norm for x in q[h]], planes), k, tables)
            sampled = sorted(offloaded[i] for i in retrieve(query_codes, buckets, len(offloaded)))
            w_all, logits = [], {}
            for j in offloaded:
                dot = sum(a * b for a, b in zip(q[h], keys[g][j]))
                w, logit = transform(dot, q_norm, math.sqrt(sum(x * x for x in keys[g][j])), k,
                                     tables)
                w_all.append(w)
                if j in sampled:
                    logits[j] = logit
            per_head.append({"sampled": sampled, "w": w_all,
                             "sampled_logits": [logits[j] for j in sampled]})
        configs.append({"bits": k, "tables": tables,
                        # kvlens's planes [tables * bits, D]: row t * K + b is column t * K + b
                        "planes": [planes[d][c] for c in range(k * tables) for d in range(D)],
                        "heads": per_head})
    fixture = {
        "about": "tools/magicpig_reference.py: Infini-AI-Lab/MagicPIG (ac9aa36) re-implemented",
        "heads": H, "kv_heads": G, "head_dim": D, "tokens": T, "sinks": SINKS, "window": WINDOW,
        "q": [x for row in q for x in row],
        "k": [x for group in keys for key in group for x in key],
        "configs": configs,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    for c in configs:
        counts = [len(hd["sampled"]) for hd in c["heads"]]
        print(f"K={c['bits']} L={c['tables']}: sampled per head {counts} of {len(offloaded)}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
