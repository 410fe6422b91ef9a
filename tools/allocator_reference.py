#!/usr/bin/env python3
"""PyramidKV's per-layer budgets and Ada-KV's per-head budgets on a Llama checkpoint, re-implemented
line by line from the authors' code, for kvlens's parity tests of `pyramidkv` and `adakv`
(tests/fixtures/allocators/).

Neither authors' code runs on the GPU machine (transformers 5, as tools/requirements.txt, and no
network to install another): KVCache-Factory pins transformers 4.44.2 and patches its Llama
attention and cache classes, Ada-KV patches transformers 4.41's and calls flash-attn's varlen
kernels. This script follows them instead, on the model's own weights and transformers' own RoPE
and repeat_kv:

- Scores, both methods: the window's attention summed over its queries, pooled along the keys,
  one top-k over the tokens before the window, the window itself always kept
  (Zefan-Cai/KVCache-Factory@c97f9d7 `pyramidkv/pyramidkv_utils.py` lines 408-438;
  FFY0/AdaKV@efe4e2e `adaptive_snapkv/monkeypatch/snapkv_utils.py` `calcul_attn_sore`, lines
  335-370).
- PyramidKV's schedule: `PyramidKVCluster.update_kv`, lines 360-370 (min = base // beta,
  max = 2 base - min, max lowered to the tokens outside the window with the mean kept, a straight
  line in depth); see `pyramid_schedule` for where it follows kvlens's rounding instead.
- Ada-KV's allocation: `AdaptiveSnapKVCluster.update_kv_wo_gqa`, lines 507-619 (each head's
  scores sorted, laid end to end, one top-k of heads * base over them, each head keeping its own
  top tokens up to its count); see `adakv_select` for the safeguard.

Both are compressions of a prompt, once. kvlens runs them in its decode simulation (every step
t a selection with the budget of that step, evicted tokens gone for good; POLICIES.md and
docs/policies/pyramidkv.md, adakv.md, "Deliberate differences"), and this reference does the
same so the sets compare exactly: tokens are fed one at a time from the first; at step t the
window is the attention rows of the previous `window` steps (as computed under their visible
sets) and the forced part is those `window` tokens plus the current one. Where kvlens departs
from the authors on purpose, the functions below follow kvlens's documented choice and say which
line of the authors' they replace.

Written per method: per step, layer and head the positions dropped at that step (the visible
set is the previous one plus the new token less those: small), each layer's budget per step
(PyramidKV) or each head's (Ada-KV), the smallest nonzero gap between the last kept and the best
dropped score (a near tie says where float rounding could choose differently) and -log p(next token).

    python3 tools/allocator_reference.py --out tests/fixtures/allocators/reference.json
"""

import argparse
import json
import math
import os
import platform
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tova_reference import coref_tokens  # noqa: E402,F401  (the same sample's ids; duo uses it too)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The runs written, each as kvlens names its policy and knobs (tests/unit/test_allocator_parity.cpp
# passes the same): budget_tokens B counts the window's `window` tokens and the current one, so
# the authors' max_capacity_prompt (window included) is B - 1 and their base is B - 1 - window.
RUNS = {
    # KVCache-Factory's defaults for PyramidKV (avg pooling, kernel 5; pyramidkv_utils.py line
    # 324), beta 20, a window of 8 and base 16.
    "pyramidkv": {"budget_tokens": 25, "window": 8, "pool": "avg", "kernel": 5, "beta": 20},
    # Ada-KV's defaults (window 32, max pooling, kernel 7, floor_alpha 0.2; snapkv_utils.py line
    # 298) with base 16.
    "adakv": {"budget_tokens": 49, "window": 32, "pool": "max", "kernel": 7, "floor_alpha": 0.2},
}


# ---------------------------------------------------------------------------------------------
# The model, one token at a time, each query head attending to its own visible set.

@torch.no_grad()
def run_masked(model, tokens, policy):
    """Feeds `tokens` one at a time. Per layer: q, k, v and RoPE at the true position; the new key
    and value appended; visible = policy.select(t, layer) (bool [H, t + 1]); the softmax of
    q.k / sqrt(D) over each head's visible keys in float32 (the probabilities go to
    policy.observe); output through o_proj and the MLP. Returns -log p(next token) per step."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    layers = model.model.layers
    keys = [None] * len(layers)    # [1, KV, n, D]
    values = [None] * len(layers)
    nll = []
    for t, token in enumerate(tokens):
        hidden = model.model.embed_tokens(torch.tensor([[token]]))  # [1, 1, E]
        cos, sin = model.model.rotary_emb(hidden, position_ids=torch.tensor([[t]]))
        for li, layer in enumerate(layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(1, 1, heads, head_dim).transpose(1, 2)      # [1, H, 1, D]
            k = attn.k_proj(x).view(1, 1, kv_heads, head_dim).transpose(1, 2)   # [1, KV, 1, D]
            v = attn.v_proj(x).view(1, 1, kv_heads, head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys[li] = k if keys[li] is None else torch.cat([keys[li], k], dim=2)
            values[li] = v if values[li] is None else torch.cat([values[li], v], dim=2)
            k_all = repeat_kv(keys[li], heads // kv_heads)                       # [1, H, n, D]
            v_all = repeat_kv(values[li], heads // kv_heads)
            logits = torch.matmul(q, k_all.transpose(2, 3)) / math.sqrt(head_dim)  # [1, H, 1, n]
            visible = torch.from_numpy(policy.select(t, li))                     # [H, n] bool
            logits = logits.masked_fill(~visible[None, :, None, :], float("-inf"))
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            policy.observe(t, li, weights[0, :, 0, :].numpy())
            out = torch.matmul(weights, v_all).transpose(1, 2).reshape(1, 1, heads * head_dim)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        if t + 1 < len(tokens):
            final = model.lm_head(model.model.norm(hidden))[0, -1].double()
            nll.append(float(-torch.log_softmax(final, dim=-1)[tokens[t + 1]]))
    return nll


class Dense:
    """Every head sees every token (the check that run_masked is transformers' forward)."""

    def __init__(self, heads):
        self.heads = heads

    def select(self, t, layer):
        return np.ones((self.heads, t + 1), dtype=bool)

    def observe(self, t, layer, probs):
        pass


@torch.no_grad()
def dense_nll(model, tokens):
    logits = model(torch.tensor([tokens])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(-logp[t, tokens[t + 1]]) for t in range(len(tokens) - 1)]


# ---------------------------------------------------------------------------------------------
# The window scores (both methods).

class WindowScores:
    """The attention each token received from the previous `window` queries, summed, per layer
    and head: the authors' `attn_weights[..., -window_size:, :-window_size].sum(dim=-2)`
    (pyramidkv_utils.py line 418; Ada-KV's `.mean(dim=-2)`, snapkv_utils.py line 349, divides by
    the window, which orders and ties the tokens alike) with the window's queries being the
    previous `window` decode steps. The sums are folded in kvlens's order (snapkv_policy.cpp's
    opening comment: the suffix of the previous chunk of `window` steps plus the prefix of the
    current one, in float32), so float rounding cannot split ties differently from it."""

    def __init__(self, layers, heads, length, window):
        self.w = window
        self.ring = np.zeros((layers, window, heads, length), dtype=np.float32)
        self.prefix = np.zeros((layers, heads, length), dtype=np.float32)

    def window_sum(self, t, layer):
        slot = t % self.w
        s = self.ring[layer, slot].copy()
        if slot > 0:
            s = s + self.prefix[layer]
        return s[:, :t + 1]

    def observe(self, t, layer, probs):
        slot, n = t % self.w, probs.shape[1]
        row = np.zeros_like(self.ring[layer, slot])
        row[:, :n] = probs
        self.ring[layer, slot] = row
        self.prefix[layer] = row if slot == 0 else self.prefix[layer] + row
        if slot + 1 == self.w:
            for i in range(self.w - 2, -1, -1):
                self.ring[layer, i] = self.ring[layer, i] + self.ring[layer, i + 1]


def pool(scores, kind, kernel):
    """The authors' F.avg_pool1d / F.max_pool1d (kernel, padding kernel // 2, stride 1;
    pyramidkv_utils.py lines 419-422, snapkv_utils.py lines 359-367) over [H, n]: avg divides
    by the kernel with the padding counting as 0 (count_include_pad). Summed from the lowest
    column up, as kvlens's pool_rows (cpu_policy_ops.cpp), for the same rounding."""
    heads, n = scores.shape
    half = kernel // 2
    out = np.zeros_like(scores)
    for j in range(n):
        lo, hi = max(0, j - half), min(n - 1, j + half)
        if kind == "max":
            out[:, j] = scores[:, lo:hi + 1].max(axis=1)
        else:
            acc = np.zeros(heads, dtype=np.float32)
            for i in range(lo, hi + 1):
                acc = acc + scores[:, i]
            out[:, j] = acc / np.float32(kernel)
    return out


def forced_begin(t, budget, window):
    """The first column of the always-kept part: the window's `window` tokens and the current one
    (the authors keep `key_states[:, :, -window_size:]` whole, pyramidkv_utils.py lines 434-437),
    truncated to the budget by POLICIES.md's priority (the current token first, then the most
    recent), as kvlens's forced_columns with no sinks."""
    earlier = max(0, min(window, t, budget - 1))
    return t - earlier


def top_tokens(scores, candidates, k):
    """The k best candidates by score, ties to the later token: the authors' `topk` (lines 393,
    425; snapkv_utils.py line 572) leaves ties to torch, kvlens breaks them toward the recent
    (POLICIES.md), and the reference follows kvlens so that the sets are defined exactly. Returns
    the chosen ones and the gap between the last chosen and the best left out (None if none)."""
    order = sorted(candidates, key=lambda c: (float(scores[c]), c), reverse=True)
    chosen = order[:max(0, k)]
    gap = None
    if 0 < len(chosen) < len(order):
        gap = float(scores[chosen[-1]]) - float(scores[order[len(chosen)]])
    return chosen, gap


# ---------------------------------------------------------------------------------------------
# PyramidKV.

def authors_pyramid(base, prompt_outside_window, layers, beta):
    """pyramidkv_utils.py lines 360-370 as written: each layer's capacity outside the window."""
    min_num = base // beta
    max_num = base * 2 - min_num
    if max_num >= prompt_outside_window:
        max_num = prompt_outside_window
        min_num = base * 2 - max_num
    steps = (max_num - min_num) // (layers - 1)
    return [max_num - layer * steps for layer in range(layers)]


def pyramid_schedule(extra, capacity, layers, beta):
    """The same ends as lines 360-366 (min = base // beta, max = 2 base - min, max lowered to the
    candidates with min raised to keep the mean; line 364 tests `>=`, which moves nothing when
    max equals them). Line 369 floors `steps`, so the authors' layers sum to a little under (or
    with min 0, over) layers * base; kvlens keeps the exact line max - (max - min) i / (n - 1)
    and rounds it by largest remainders, ties to the shallower layer, so the total is exactly
    layers * base (docs/policies/pyramidkv.md, "line"): followed here."""
    if layers == 1:
        return [extra]
    lo, hi = extra // beta, 2 * extra - extra // beta
    if hi > capacity:
        hi, lo = capacity, 2 * extra - capacity
    d = layers - 1
    numerators = [hi * d - (hi - lo) * i for i in range(layers)]
    out = [x // d for x in numerators]
    order = sorted(range(layers), key=lambda i: (-(numerators[i] % d), i))
    for i in order[:layers * extra - sum(out)]:
        out[i] += 1
    return out


def pyramid_allocation(extra, capacity, room, beta):
    """kvlens's room rule (docs/policies/pyramidkv.md, "per-layer room"; the authors compress once
    and need none): a layer that kept b tokens at the step before has b + 1 candidates now, so
    its share is held to that, and what it cannot take goes to the shallowest layers with room."""
    out = pyramid_schedule(extra, capacity, len(room), beta)
    excess = 0
    for i, r in enumerate(room):
        if r >= 0 and out[i] > r:
            excess += out[i] - r
            out[i] = r
    for i, r in enumerate(room):
        if excess <= 0:
            break
        limit = min(r, capacity) if r >= 0 else capacity
        take = min(excess, limit - out[i])
        if take > 0:
            out[i] += take
            excess -= take
    return out


class Eviction:
    """The decode-form selection both methods share: per layer and head the tokens still kept;
    at step t the forced part plus a budgeted top-k of the window scores among the kept ones;
    what is not chosen is dropped for good (the authors' gather, lines 432-437, keeps nothing
    else)."""

    def __init__(self, layers, heads, length, cfg):
        self.cfg, self.layers, self.heads = cfg, layers, heads
        self.scores = WindowScores(layers, heads, length, cfg["window"])
        self.kept = np.ones((layers, heads, length), dtype=bool)
        self.dropped = []   # [step][layer][head] -> positions dropped at that step
        self.budgets = []   # [step][layer] (pyramidkv) or [step][layer][head] (adakv)
        self.smallest_gap = math.inf

    def budget(self, t):
        return min(self.cfg["budget_tokens"], t + 1)

    def begin_step(self, t):
        self.dropped.append([None] * self.layers)
        self.budgets.append([None] * self.layers)

    def note_gap(self, gap):
        # Exact ties (a max-pooled value copied to its neighbours, zeros) are the same on both
        # sides and go to the later token; a near tie is where rounding could choose otherwise.
        if gap is not None and gap > 0:
            self.smallest_gap = min(self.smallest_gap, gap)

    def select(self, t, layer):
        if layer == 0:
            self.begin_step(t)
        pooled = pool(self.scores.window_sum(t, layer), self.cfg["pool"], self.cfg["kernel"])
        chosen = self.choose(t, layer, pooled)                  # bool [H, t + 1]
        before = self.kept[layer, :, :t + 1].copy()
        self.kept[layer, :, :t + 1] &= chosen
        self.dropped[t][layer] = [np.flatnonzero(before[h] & ~chosen[h]).tolist()
                                  for h in range(self.heads)]
        return chosen

    def observe(self, t, layer, probs):
        self.scores.observe(t, layer, probs)


class Pyramid(Eviction):
    def __init__(self, *args):
        super().__init__(*args)
        self.last_budget = [None] * self.layers  # (step, budget) of each layer's last selection
        self.room = None

    def choose(self, t, layer, pooled):
        cfg = self.cfg
        budget = self.budget(t)
        begin = forced_begin(t, budget, cfg["window"])
        forced = t + 1 - begin
        extra = budget - forced
        capacity = max(extra, t + 1 - forced)
        if layer == 0:
            # Each layer's room at this step (its budget at step t - 1 plus the new token; -1: no
            # limit), taken before any layer records this step's budget.
            self.room = [-1 if last is None or last[0] != t - 1 else last[1] + 1
                         for last in self.last_budget]
        room = [max(0, r - forced) if r >= 0 else -1 for r in self.room]
        share = pyramid_allocation(extra, capacity, room, cfg["beta"])[layer]
        self.last_budget[layer] = (t, forced + share)
        self.budgets[t][layer] = forced + share
        chosen = np.zeros((self.heads, t + 1), dtype=bool)
        for h in range(self.heads):
            eligible = self.kept[layer, h, :t + 1]
            chosen[h, begin:] = eligible[begin:]
            picked, gap = top_tokens(pooled[h], [j for j in range(begin) if eligible[j]], share)
            chosen[h, picked] = True
            self.note_gap(gap)
        return chosen


# ---------------------------------------------------------------------------------------------
# Ada-KV.

class Adaptive(Eviction):
    def choose(self, t, layer, pooled):
        """snapkv_utils.py lines 566-578: one top-k of heads * base over every head's sorted
        scores, each head's count mixed with the uniform share, `round(count * (1 - floor_alpha)
        + floor_capacity)`, floor_capacity = int(base * floor_alpha) (lines 305, 534). kvlens gives each
        head its floor first, floor(floor_alpha * base) of its own best tokens, and then one top-k
        over all heads' remaining candidates takes heads * (base - floor) more (ties to the later
        head, then the later token), so the total is exactly heads * budget
        (docs/policies/adakv.md, "safeguard"): followed here. A head keeps the tokens it got
        (its own best: the authors' per-head `sorted_attn_score_indices[...,:capacity]`, line
        596), plus the window (line 606)."""
        cfg = self.cfg
        budget = self.budget(t)
        begin = forced_begin(t, budget, cfg["window"])
        extra = budget - (t + 1 - begin)
        chosen = np.zeros((self.heads, t + 1), dtype=bool)
        own = min(extra, max(0, math.floor(cfg["floor_alpha"] * extra))) if extra > 0 else 0
        rest = []
        for h in range(self.heads):
            eligible = self.kept[layer, h, :t + 1]
            chosen[h, begin:] = eligible[begin:]
            candidates = [j for j in range(begin) if eligible[j]]
            picked, gap = top_tokens(pooled[h], candidates, own if extra > 0 else extra)
            chosen[h, picked] = True
            self.note_gap(gap)
            rest += [(h, j) for j in candidates if j not in picked]
        if extra > 0:
            flat = {(h, j): pooled[h, j] for h, j in rest}
            picked, gap = top_tokens(flat, rest, self.heads * (extra - own))
            for h, j in picked:
                chosen[h, j] = True
            self.note_gap(gap)
        self.budgets[t][layer] = chosen.sum(axis=1).tolist()
        return chosen


# ---------------------------------------------------------------------------------------------

def load_llama(path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    if model.config.model_type != "llama":
        sys.exit(f"{path}: config.json model_type is {model.config.model_type!r}, expected "
                 "'llama' (the step-by-step forward is Llama's)")
    return model


def dense_check(model, tokens):
    """The largest gap between run_masked with everything visible and transformers' forward."""
    unreduced = run_masked(model, tokens, Dense(model.config.num_attention_heads))
    gap = max(abs(a - b) for a, b in zip(unreduced, dense_nll(model, tokens)))
    if gap > 1e-4:
        sys.exit(f"the step-by-step forward differs from transformers' by {gap:.2e} nats")
    return gap


def common_args(ap):
    ap.add_argument("--model", default=os.path.join(ROOT, "assets", "models", "demo"))
    ap.add_argument("--tokens-from-coref", type=int, default=0,
                    help="co-reference sample index (seed 0, bundled pools) to take tokens from")
    ap.add_argument("--kvlens-cli", default=os.environ.get("KVLENS_CLI", os.path.join(
        ROOT, "build", "app", "kvlens-cli")))
    ap.add_argument("--out", required=True)


def versions():
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def write_json(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_llama(args.model)
    tokens = coref_tokens(args.kvlens_cli, args.model, args.tokens_from_coref)
    gap = dense_check(model, tokens)
    cfg = model.config
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads

    result = {
        "source": "Zefan-Cai/KVCache-Factory@c97f9d7 pyramidkv/pyramidkv_utils.py "
                  "PyramidKVCluster.update_kv (lines 348-438); FFY0/AdaKV@efe4e2e "
                  "adaptive_snapkv/monkeypatch/snapkv_utils.py calcul_attn_sore (lines 335-370), "
                  "AdaptiveSnapKVCluster.update_kv_wo_gqa (lines 507-619); re-implemented in "
                  "tools/allocator_reference.py",
        "model": os.path.relpath(os.path.abspath(args.model), ROOT),
        "tokens": tokens,
        "coref_sample": {"seed": 0, "index": args.tokens_from_coref},
    }
    summary = []
    for name, run_cfg in RUNS.items():
        policy = (Pyramid if name == "pyramidkv" else Adaptive)(layers, heads, len(tokens),
                                                                 run_cfg)
        nll = run_masked(model, tokens, policy)
        entry = {"settings": run_cfg, "dropped": policy.dropped, "budgets": policy.budgets,
                 "smallest_gap": float(f"{policy.smallest_gap:.6g}"),
                 "nll": [float(f"{x:.9g}") for x in nll]}
        if name == "pyramidkv":
            # The authors' own capacities outside the window for the same base and a prompt of
            # the whole sample (lines 360-370, steps floored), beside kvlens's at the last step.
            base = run_cfg["budget_tokens"] - 1 - run_cfg["window"]
            entry["authors_capacity"] = authors_pyramid(
                base, len(tokens) - 1 - run_cfg["window"], layers, run_cfg["beta"])
        result[name] = entry
        summary.append(f"{name}: smallest gap {policy.smallest_gap:.3g}")
    result["notes"] = {"dense_check_max_nll_gap": float(f"{gap:.3g}"),
                       "dtype": "float32 weights (the checkpoint's BF16 widened), eager "
                                "attention, one CPU thread"}
    result["versions"] = versions()
    write_json(args.out, result)
    print(f"wrote {args.out}: {len(tokens)} tokens, {'; '.join(summary)}, dense check "
          f"{gap:.2e} nats")


if __name__ == "__main__":
    main()
