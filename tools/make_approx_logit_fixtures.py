#!/usr/bin/env python3
"""The approximate-logit policies' parity fixture (tests/fixtures/approx_logits/reference.json):
random queries and keys at the policy harness' shape (4 query heads over 2 KV heads, D = 4, 12
cached tokens), each method's approximate scores and kept sets computed the way the authors'
code computes them, re-implemented here step by step (torch, float64) from:

  SparQ   graphcore-research/llm-inference-research, llminference/methods/ann_attention.py:
          SparseQ.forward (lines 81-114: |q| summed over the KV group, top-r channels, the
          sqrt(D * l1 coverage) scale), AnnAttention.forward (lines 232-245: scores summed over
          the group, the current token forced, top k + 1)
  Loki    hpcgroup/loki, methods/pca_topk/utils.py: mask_attn_pca_topk (lines 97-119: keys and
          query times the first r components, / sqrt(D), top k per head)
  DoubleSparsity
          andy-yang-1/DoubleSparse, LongBench/modify_llama.py: LlamaAttention_heavy_hitter.forward
          (lines 167-190: q and k gathered at the head's sorted channels, the first
          D / group_factor of them, / sqrt(D / group_factor), top heavy_const per head)

The current token: kvlens always shows it, so every set below is the current token plus the
method's top (k) of the other candidates. Run: python3 tools/make_approx_logit_fixtures.py
(deterministic: seed 7); tests/unit/test_approx_logit_parity.cpp reads the file.
"""

import argparse
import json
import math
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "approx_logits", "reference.json")
H, G, D, T = 4, 2, 4, 12  # query heads, KV heads, head_dim, cached tokens (the last is current)
RANK, DIMS, CHANNELS, KEEP = 2, 2, 2, 5  # r of each method, KEEP other tokens besides the current


def top_others(scores, keep):
    """The current token (last column) and the `keep` best of the others, sorted."""
    best = torch.topk(scores[:-1], keep).indices.tolist()
    return sorted(best + [scores.shape[0] - 1])


def sparq(q, k):
    """ann_attention.py SparseQ.forward, then AnnAttention.forward's group top-k."""
    group = H // G
    scores = torch.empty(H, T, dtype=torch.float64)
    kept = []
    for g in range(G):
        qg = q[g * group:(g + 1) * group]  # [group, D]
        channels = qg.abs().sum(0).topk(RANK).indices  # summed over the group's heads
        for i in range(group):
            qh = qg[i]
            scale = math.sqrt(qh[channels].abs().sum() / qh.abs().sum() * D)
            scores[g * group + i] = (qh[channels] / scale) @ k[g][:, channels].T
        kept.append(top_others(scores[g * group:(g + 1) * group].sum(0), KEEP))
    return scores, kept


def loki(q, k, basis):
    """utils.py mask_attn_pca_topk: (q P_r)(K P_r)^T / sqrt(D), top-k per head."""
    scores = torch.empty(H, T, dtype=torch.float64)
    for h in range(H):
        components = basis[h // (H // G)][:, :DIMS]
        scores[h] = (q[h] @ components) @ (k[h // (H // G)] @ components).T / math.sqrt(D)
    return scores, [top_others(scores[h], KEEP) for h in range(H)]


def doublesparsity(q, k, order):
    """modify_llama.py: q and k at the head's first D / group_factor sorted channels,
    / sqrt(D / group_factor), top heavy_const per head."""
    scores = torch.empty(H, T, dtype=torch.float64)
    for h in range(H):
        channels = order[h][:CHANNELS]
        scores[h] = q[h][channels] @ k[h // (H // G)][:, channels].T / math.sqrt(CHANNELS)
    return scores, [top_others(scores[h], KEEP) for h in range(H)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=OUT, help="the fixture file (default: the committed one)")
    out = p.parse_args(argv).out
    gen = torch.Generator().manual_seed(7)
    as_f32 = lambda x: x.float().double()  # noqa: E731 - values exact in F32, as kvlens reads them
    q = as_f32(torch.randn(H, D, generator=gen, dtype=torch.float64))
    k = as_f32(torch.randn(G, T, D, generator=gen, dtype=torch.float64))
    basis = torch.stack([torch.linalg.qr(torch.randn(D, D, generator=gen,
                                                     dtype=torch.float64))[0] for _ in range(G)])
    basis = as_f32(basis)
    order = torch.stack([torch.randperm(D, generator=gen) for _ in range(H)])
    sparq_scores, sparq_kept = sparq(q, k)
    loki_scores, loki_kept = loki(q, k, basis)
    ds_scores, ds_kept = doublesparsity(q, k, order)
    fixture = {
        "about": "tools/make_approx_logit_fixtures.py: the authors' scoring re-implemented",
        "heads": H, "kv_heads": G, "head_dim": D, "tokens": T, "keep_others": KEEP,
        "q": q.flatten().tolist(), "k": k.flatten().tolist(),
        "sparq": {"channels": RANK, "scores": sparq_scores.flatten().tolist(),
                  "kept_per_kv_head": sparq_kept},
        "loki": {"dims": DIMS, "basis": basis.flatten().tolist(),
                 "scores": loki_scores.flatten().tolist(), "kept": loki_kept},
        "doublesparsity": {"channels": CHANNELS, "order": order.flatten().tolist(),
                           "scores_authors_scale": ds_scores.flatten().tolist(),
                           "kept": ds_kept},
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
