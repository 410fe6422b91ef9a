#!/usr/bin/env python3
"""TOVA's reference visible sets on a Llama checkpoint, re-implemented line by line from the
authors' code, for kvlens's parity test of its `tova` policy (tests/fixtures/tova/).

The authors' code (github.com/schwartz-lab-NLP/TOVA at 9c7d09b) patches transformers 4.3x's
LlamaAttention and subclasses its old DynamicCache; neither exists in transformers 5, the version
on the GPU machine and in tools/requirements.txt, so it cannot run there. This script follows it
step for step instead, on the model's own weights and transformers' own RoPE helpers:

- `src/convert_models/llama_custom.py`, `tova_llama_attention_forward` (lines 13-118): q, k, v
  projections; RoPE at the token's true position (`position_ids` count every token seen, lines
  184-186, so a kept key keeps the rotation of its original position); the new key and value
  appended to the layer's cache (`past_key_value.update`); keys and values repeated to the query
  heads (`repeat_kv`); logits q.k / sqrt(head_dim); softmax in float32; output through o_proj;
  then `past_key_value.reduce(layer_idx, attn_weights)` (line 112-113) AFTER the attention.
- `src/tova_cache.py`, `TOVACache.reduce` (lines 38-55): if the layer holds more than
  `cache_size` keys, the last query row's weights averaged over the query heads, `torch.topk`
  of `cache_size`, the indices sorted, and every KV head's keys and values gathered at them.

Tokens are fed one at a time from the first (kvlens's decode simulation; the authors' generate
would reduce a prompt once after its prefill, which kvlens's tova does one step later, as
docs/policies/tova.md says). Written per step: the original positions each layer keeps after
its reduction, the gap between the last kept and the first dropped averaged weight (a near tie
says where float rounding may pick differently), and -log p(next token) under the reduced
caches.

    python3 tools/tova_reference.py --model assets/models/demo --cache-size 24 \\
        --tokens-from-coref 0 --out tests/fixtures/tova/reference.json
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rms_norm(norm, x):
    # The module itself: LlamaRMSNorm (float32 variance, weight after).
    return norm(x)


@torch.no_grad()
def run(model, tokens, cache_size):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    layers = model.model.layers
    # Per layer: keys/values [1, kv_heads, n, head_dim] and the original position of each column.
    keys = [None] * len(layers)
    values = [None] * len(layers)
    positions = [[] for _ in layers]
    kept, margins, nll = [], [], []
    for t, token in enumerate(tokens):
        hidden = model.model.embed_tokens(torch.tensor([[token]]))  # [1, 1, E]
        position_ids = torch.tensor([[t]])
        cos, sin = model.model.rotary_emb(hidden, position_ids=position_ids)
        step_kept, step_margin = [], []
        for li, layer in enumerate(layers):
            attn = layer.self_attn
            x = rms_norm(layer.input_layernorm, hidden)
            q = attn.q_proj(x).view(1, 1, heads, head_dim).transpose(1, 2)      # [1, H, 1, D]
            k = attn.k_proj(x).view(1, 1, kv_heads, head_dim).transpose(1, 2)   # [1, KV, 1, D]
            v = attn.v_proj(x).view(1, 1, kv_heads, head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys[li] = k if keys[li] is None else torch.cat([keys[li], k], dim=2)
            values[li] = v if values[li] is None else torch.cat([values[li], v], dim=2)
            positions[li].append(t)
            k_all = repeat_kv(keys[li], heads // kv_heads)                       # [1, H, n, D]
            v_all = repeat_kv(values[li], heads // kv_heads)
            logits = torch.matmul(q, k_all.transpose(2, 3)) / math.sqrt(head_dim)  # [1, H, 1, n]
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, v_all).transpose(1, 2).reshape(1, 1, heads * head_dim)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(rms_norm(layer.post_attention_layernorm, hidden))
            # TOVACache.reduce: after the attention, by its last query row.
            n = keys[li].shape[2]
            margin = None
            if n > cache_size:
                mean = weights[:, :, -1, :].mean(dim=1)                          # [1, n]
                _, index = torch.topk(mean, k=cache_size, dim=-1)
                index = torch.sort(index).values                                 # [1, M]
                ranked = torch.sort(mean[0], descending=True).values
                margin = float(ranked[cache_size - 1] - ranked[cache_size])
                gather = index.unsqueeze(1).unsqueeze(-1).expand(1, kv_heads, cache_size, head_dim)
                keys[li] = torch.gather(keys[li], 2, gather)
                values[li] = torch.gather(values[li], 2, gather)
                positions[li] = [positions[li][i] for i in index[0].tolist()]
            step_kept.append(list(positions[li]))
            step_margin.append(margin)
        kept.append(step_kept)
        margins.append(step_margin)
        if t + 1 < len(tokens):
            final = model.lm_head(model.model.norm(hidden))[0, -1].double()
            nll.append(float(-torch.log_softmax(final, dim=-1)[tokens[t + 1]]))
    return kept, margins, nll


@torch.no_grad()
def dense_nll(model, tokens):
    logits = model(torch.tensor([tokens])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(-logp[t, tokens[t + 1]]) for t in range(len(tokens) - 1)]


def coref_tokens(cli, model_dir, index):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "samples.jsonl")
        subprocess.run([cli, "coref-samples", "--count", str(index + 1), "--seed", "0",
                        "--tokenizer", os.path.join(model_dir, "tokenizer.json"), "--out", path],
                       capture_output=True, text=True, check=True)
        with open(path) as f:
            return json.loads(f.read().splitlines()[index])["tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "assets", "models", "demo"))
    ap.add_argument("--cache-size", type=int, default=24, help="TOVA's M (the cache size)")
    ap.add_argument("--tokens-from-coref", type=int, default=0,
                    help="co-reference sample index (seed 0, bundled pools) to take tokens from")
    ap.add_argument("--kvlens-cli", default=os.environ.get("KVLENS_CLI", os.path.join(
        ROOT, "build", "app", "kvlens-cli")))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cache_size < 1:
        ap.error(f"--cache-size {args.cache_size}: expected at least 1")

    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    if model.config.model_type != "llama":
        sys.exit(f"{args.model}: config.json model_type is {model.config.model_type!r}, "
                 "expected 'llama' (the authors' code patches Llama attention)")
    tokens = coref_tokens(args.kvlens_cli, args.model, args.tokens_from_coref)

    # The re-implemented forward must be transformers' own where nothing is evicted.
    _, _, unreduced = run(model, tokens, cache_size=len(tokens))
    reference = dense_nll(model, tokens)
    gap = max(abs(a - b) for a, b in zip(unreduced, reference))
    if gap > 1e-4:
        sys.exit(f"the step-by-step forward differs from transformers' by {gap:.2e} nats")

    kept, margins, nll = run(model, tokens, args.cache_size)
    result = {
        "source": "schwartz-lab-NLP/TOVA@9c7d09b: src/tova_cache.py TOVACache.reduce (lines "
                  "38-55), src/convert_models/llama_custom.py tova_llama_attention_forward "
                  "(lines 13-118); re-implemented in tools/tova_reference.py",
        "model": os.path.relpath(os.path.abspath(args.model), ROOT),
        "tokens": tokens,
        "coref_sample": {"seed": 0, "index": args.tokens_from_coref},
        "cache_size": args.cache_size,
        "kept": kept,
        "margin": [[None if m is None else float(f"{m:.6g}") for m in step] for step in margins],
        "nll": [float(f"{x:.9g}") for x in nll],
        "notes": {"dense_check_max_nll_gap": float(f"{gap:.3g}"),
                  "dtype": "float32 weights (the checkpoint's BF16 widened), eager attention, "
                           "one CPU thread"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    smallest = min(m for step in margins for m in step if m is not None)
    print(f"wrote {args.out}: {len(tokens)} tokens, M = {args.cache_size}, smallest reduce "
          f"margin {smallest:.3g}, dense check {gap:.2e} nats")


if __name__ == "__main__":
    main()
