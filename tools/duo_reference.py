#!/usr/bin/env python3
"""DuoAttention's decode-time visible sets on a Llama checkpoint with its head gates, re-implemented
line by line from the authors' code, for kvlens's parity test of its `duoattention` policy
(tests/fixtures/duo/).

The authors' inference path (github.com/mit-han-lab/duo-attention at fe93c31) needs flash-attn
and flashinfer and patches transformers 4.45's Llama classes (their README's versions); it does
not run with transformers 5, the GPU machine's (tools/requirements.txt), which has no network to
install others. This script follows it:

- `duo_attn/utils.py` `load_attn_pattern` (lines 326-336): the gates clipped to [0, 1];
  `sparsify_attention_heads` (lines 353-373): a uniform noise in [0, 1e-6) added to break ties,
  the threshold the `sparsity`-quantile of all gates (np.quantile), heads at or above it full
  (retrieval) heads, the others streaming heads.
- `duo_attn/patch/static_kv_cache.py` `DuoAttentionStaticKVCache`: a streaming head's cache holds
  the first `sink_size` tokens and the last `recent_size` (`compress_and_replace_streaming_kv`,
  lines 127-167, after every call); `duo_attn/patch/llama.py`
  `llama_duo_attention_forward_one_way_reordered_static` (lines 309-434): at decode the new
  token's key and value are appended to that cache before the attention (lines 382-390), so a
  streaming head sees sink_size + recent_size + 1 tokens, and a full head every token
  (`put_full_kv`, lines 109-125).

Tokens are fed one at a time from the first (kvlens's decode simulation: the authors' prefill
would be full for every head, the project's dense prefill). Written per head sparsity: the 0/1
pattern [layers][kv_heads], per step the columns a streaming head sees (as [begin, end) ranges),
and -log p(next token) under those sets. kvlens's `duoattention` with
retrieval_frac = 1 - sparsity, sink_tokens = sink_size and recent_tokens = recent_size + 1 (its
recent tokens count the current one) must give the same sets and losses.

    python3 tools/duo_reference.py --out tests/fixtures/duo/reference.json
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocator_reference as ar  # noqa: E402  (the shared step-by-step forward)

SPARSITIES = [0.25, 0.5, 0.6]  # 0.75 falls among tied gates of 1 for the round-7 demo model
SINK_SIZE, RECENT_SIZE = 4, 15


def sparsify(gates, sparsity, noise_seed):
    """sparsify_attention_heads (utils.py lines 353-373) on a copy of the gates."""
    full = np.clip(gates.astype(np.float64), 0, 1)                 # load_attn_pattern, line 332
    if noise_seed is not None:
        full = full + np.random.default_rng(noise_seed).uniform(0, 1e-6, full.shape)
    threshold = np.quantile(full, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return (full >= threshold).astype(int)


def noise_free_pattern(gates, sparsity):
    """The pattern at `sparsity` with the authors' noise (seeded), refused where another draw of
    the noise would give another pattern (gates tied across the threshold): the fixture would
    then be a draw, and kvlens breaks such ties by layer and head order instead."""
    pattern = sparsify(gates, sparsity, noise_seed=0)
    for seed in (None, 1, 2):
        if not np.array_equal(sparsify(gates, sparsity, seed), pattern):
            sys.exit(f"sparsity {sparsity}: the head pattern depends on the tie-breaking noise "
                     "(gates tied across the threshold); choose another sparsity")
    return pattern


def load_gates(model_dir, layers, kv_heads):
    """duo_gates.safetensors beside the model: `gates` F32 [layers, kv_heads] (kvlens's file,
    docs/policies/duoattention.md; the authors' full_attention_heads.tsv holds the same)."""
    from safetensors.numpy import load_file
    path = os.path.join(model_dir, "duo_gates.safetensors")
    if not os.path.exists(path):
        sys.exit(f"{path}: missing (tools/train_duo_gates.py makes it)")
    gates = load_file(path).get("gates")
    if gates is None or gates.shape != (layers, kv_heads):
        sys.exit(f"{path}: gates {None if gates is None else gates.shape}, expected "
                 f"({layers}, {kv_heads})")
    return gates


def streaming_columns(t, sink, recent):
    """What a streaming head sees at step t: its cache before the step, everything while at most
    sink + recent tokens came before (line 131's branch keeps them all), else the first `sink`
    and the last `recent` of them (lines 143-152), plus the new token."""
    if t <= sink + recent:
        return [[0, t + 1]]
    return [[0, sink], [t - recent, t + 1]]


class Duo:
    def __init__(self, pattern, heads, sink, recent):
        self.pattern, self.group = pattern, heads // pattern.shape[1]
        self.heads, self.sink, self.recent = heads, sink, recent

    def select(self, t, layer):
        visible = np.zeros((self.heads, t + 1), dtype=bool)
        for h in range(self.heads):
            if self.pattern[layer, h // self.group]:
                visible[h] = True
            else:
                for begin, end in streaming_columns(t, self.sink, self.recent):
                    visible[h, begin:end] = True
        return visible

    def observe(self, t, layer, probs):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ar.common_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = ar.load_llama(args.model)
    cfg = model.config
    gates = load_gates(args.model, cfg.num_hidden_layers, cfg.num_key_value_heads)  # [L, KV]
    tokens = ar.coref_tokens(args.kvlens_cli, args.model, args.tokens_from_coref)
    gap = ar.dense_check(model, tokens)
    runs = []
    for sparsity in SPARSITIES:
        pattern = noise_free_pattern(gates, sparsity)
        duo = Duo(pattern, cfg.num_attention_heads, SINK_SIZE, RECENT_SIZE)
        nll = ar.run_masked(model, tokens, duo)
        runs.append({"sparsity": sparsity, "retrieval_heads": int(pattern.sum()),
                     "pattern": pattern.tolist(),
                     "nll": [float(f"{x:.9g}") for x in nll]})
    result = {
        "source": "mit-han-lab/duo-attention@fe93c31: duo_attn/utils.py load_attn_pattern "
                  "(lines 326-336), sparsify_attention_heads (lines 353-373); "
                  "duo_attn/patch/static_kv_cache.py compress_and_replace_streaming_kv "
                  "(lines 127-167); duo_attn/patch/llama.py "
                  "llama_duo_attention_forward_one_way_reordered_static (lines 309-434); "
                  "re-implemented in tools/duo_reference.py",
        "model": os.path.relpath(os.path.abspath(args.model), ar.ROOT),
        "tokens": tokens,
        "coref_sample": {"seed": 0, "index": args.tokens_from_coref},
        "sink_size": SINK_SIZE,
        "recent_size": RECENT_SIZE,
        "streaming": [streaming_columns(t, SINK_SIZE, RECENT_SIZE) for t in range(len(tokens))],
        "runs": runs,
        "notes": {"dense_check_max_nll_gap": float(f"{gap:.3g}"),
                  "dtype": "float32 weights (the checkpoint's BF16 widened), eager attention, "
                           "one CPU thread"},
        "versions": ar.versions(),
    }
    ar.write_json(args.out, result)
    print(f"wrote {args.out}: {len(tokens)} tokens, retrieval heads "
          f"{[r['retrieval_heads'] for r in runs]} at sparsity {SPARSITIES}, dense check "
          f"{gap:.2e} nats")


if __name__ == "__main__":
    main()
