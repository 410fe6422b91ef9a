#!/usr/bin/env python3
"""Trains the seerattention policy's block gate (SeerAttention-R's decode gate, docs/policies/
seerattention.md) for a kvlens model folder by self-distillation on the model's own attention, and
writes seer_gate.safetensors + seer_gate.json beside the model (or into --out).

Shapes (per layer l, KV head g; group = H / G query heads, D = head_dim, d = --gate-dim):
  layers.{l}.q_proj.weight      [G, d, group * D]  the group's post-RoPE queries, concatenated
  layers.{l}.k_max_proj.weight  [G, d, D]          the block's channel-wise key maximum
  layers.{l}.k_min_proj.weight  [G, d, D]          the block's channel-wise key minimum
  layers.{l}.q_norm.weight, layers.{l}.k_norm.weight  [G, d]  RMSNorm weights (eps 1e-6)
Gate logit of block b for a query: rmsnorm(Wq q) . rmsnorm(Wmax kmax_b + Wmin kmin_b) / sqrt(d).

Target (the paper's): the true attention of each query head (post-RoPE, causal softmax) summed
over each block, max over the group's heads, renormalised over the blocks the gate ranks; the loss
is KL(target || softmax(gate logits)) over the last (1 - --loss-from) of each sequence's rows,
averaged over rows, KV heads and layers. Only blocks that ended before the query are ranked (the
current block is always kept by the policy). Data loading and held-out split: train_predictor.py's.

Demo model (CPU, about twelve minutes; the bundled gate, docs/policies/seerattention.md):
    build/app/kvlens-cli coref-samples --count 2000 --seed 1000 --out /tmp/coref_train.jsonl
    python3 tools/train_seer_gate.py --model assets/models/demo \\
        --data ../shared/data/corpus/gutenberg-00.txt ../shared/data/corpus/c4-realnewslike-sample.jsonl \\
               /tmp/coref_train.jsonl --steps 300
Big model: add --device cuda (and larger --block-size, --gate-dim, --seq-len).
"""

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402
import train_predictor as tp  # noqa: E402

T0 = time.time()
NORM_EPS = 1e-6


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def shape_of(config):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"], heads, kv_heads, head_dim


@torch.no_grad()
def layer_qk(model, hidden_states, layer_idx, kv_heads):
    """Post-RoPE queries [B, H, L, D] and keys [B, G, L, D] of one layer (what kvlens caches)."""
    layer = tb._decoder(model).layers[layer_idx]
    attn = layer.self_attn
    heads = model.config.num_attention_heads
    h = layer.input_layernorm(hidden_states[layer_idx])
    B, L, _ = h.shape
    head_dim = getattr(attn, "head_dim", None) or h.shape[-1] // heads
    q = attn.q_proj(h).view(B, L, heads, head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(B, L, kv_heads, head_dim).transpose(1, 2)
    cos, sin = tb._rotary(model, layer, h, torch.arange(L, device=h.device)[None].expand(B, L))
    cos, sin = cos[:, None], sin[:, None]
    return q * cos + tb.rotate_half(q) * sin, k * cos + tb.rotate_half(k) * sin


def block_minmax(k, block):
    """k [B, G, L, D] -> max, min [B, G, P, D] over the complete blocks (P = L // block)."""
    B, G, L, D = k.shape
    P = L // block
    blocks = k[:, :, :P * block].reshape(B, G, P, block, D)
    return blocks.amax(dim=3), blocks.amin(dim=3)


def ranked_blocks(L, block, device):
    """[L, P] bool: block b is ranked for query row i when it ended before i ((b+1)*block <= i)."""
    P = L // block
    ends = (torch.arange(P, device=device) + 1) * block
    return ends[None, :] <= torch.arange(L, device=device)[:, None]


@torch.no_grad()
def block_target(q, k, block, group):
    """The distillation target [B, G, L, P]: causal softmax attention per query head summed per
    block, max over the group's heads, renormalised over the ranked blocks (rows with none: 0)."""
    B, H, L, D = q.shape
    kx = k.repeat_interleave(group, dim=1)
    logits = torch.matmul(q, kx.transpose(-1, -2)) / math.sqrt(D)
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    probs = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    P = L // block
    mass = probs[..., :P * block].reshape(B, H, L, P, block).sum(-1)
    mass = mass.view(B, H // group, group, L, P).amax(dim=2)
    mass = mass * ranked_blocks(L, block, q.device)
    return mass / mass.sum(-1, keepdim=True).clamp_min(1e-30)


def rmsnorm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight


class SeerGate(torch.nn.Module):
    """One gate per layer (the authors' AttnGate with Qproj and Kmaxmin, qk-norm on, no RoPE of
    its own: kvlens's keys and queries carry the model's)."""

    def __init__(self, layers, heads, kv_heads, head_dim, gate_dim):
        super().__init__()
        group = heads // kv_heads
        self.layers, self.heads, self.kv_heads, self.head_dim = layers, heads, kv_heads, head_dim
        self.gate_dim = gate_dim

        def param(*shape, fan_in):
            bound = math.sqrt(6.0 / (fan_in + gate_dim))  # xavier uniform, as the authors
            return torch.nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))

        self.q_proj = torch.nn.ParameterList(
            [param(kv_heads, gate_dim, group * head_dim, fan_in=group * head_dim)
             for _ in range(layers)])
        self.k_max_proj = torch.nn.ParameterList(
            [param(kv_heads, gate_dim, head_dim, fan_in=2 * head_dim) for _ in range(layers)])
        self.k_min_proj = torch.nn.ParameterList(
            [param(kv_heads, gate_dim, head_dim, fan_in=2 * head_dim) for _ in range(layers)])
        self.q_norm = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.ones(kv_heads, gate_dim)) for _ in range(layers)])
        self.k_norm = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.ones(kv_heads, gate_dim)) for _ in range(layers)])

    def logits(self, layer, q, kmax, kmin):
        """q [B, H, L, D], kmax/kmin [B, G, P, D] -> gate logits [B, G, L, P]."""
        B, H, L, D = q.shape
        G = self.kv_heads
        qg = q.view(B, G, H // G, L, D).permute(0, 1, 3, 2, 4).reshape(B, G, L, -1)
        gq = rmsnorm(torch.einsum("bgli,goi->bglo", qg, self.q_proj[layer]),
                     self.q_norm[layer][None, :, None])
        gk = (torch.einsum("bgpi,goi->bgpo", kmax, self.k_max_proj[layer]) +
              torch.einsum("bgpi,goi->bgpo", kmin, self.k_min_proj[layer]))
        gk = rmsnorm(gk, self.k_norm[layer][None, :, None])
        return torch.matmul(gq, gk.transpose(-1, -2)) / math.sqrt(self.gate_dim)


def layer_terms(gate, model, hidden, layer, block, loss_from):
    """(KL loss, block hit rate) of one layer over rows >= loss_from * L with >= 2 ranked blocks.
    Hit rate: the share of the true top ceil(n/2) blocks (n ranked) that the gate's top holds."""
    q, k = layer_qk(model, hidden, layer, gate.kv_heads)
    target = block_target(q, k, block, gate.heads // gate.kv_heads)
    kmax, kmin = block_minmax(k, block)
    logits = gate.logits(layer, q, kmax, kmin)
    L = q.shape[2]
    ranked = ranked_blocks(L, block, q.device)
    rows = (ranked.sum(-1) >= 2) & (torch.arange(L, device=q.device) >= int(L * loss_from))
    logp = logits.masked_fill(~ranked, float("-inf")).log_softmax(-1)
    kl = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - logp),
                     torch.zeros_like(target)).sum(-1)
    loss = kl[..., rows].mean()
    with torch.no_grad():
        n = ranked.sum(-1)
        keep = (n + 1) // 2
        order_t = target.masked_fill(~ranked, -1.0).argsort(dim=-1, descending=True, stable=True)
        order_p = logits.masked_fill(~ranked, float("-inf")).argsort(dim=-1, descending=True,
                                                                       stable=True)
        P = ranked.shape[1]
        rank_pos = torch.arange(P, device=q.device)
        top_t = torch.zeros_like(target, dtype=torch.bool).scatter(
            -1, order_t, rank_pos.expand_as(order_t) < keep[:, None])
        top_p = torch.zeros_like(target, dtype=torch.bool).scatter(
            -1, order_p, rank_pos.expand_as(order_p) < keep[:, None])
        hits = (top_t & top_p).sum(-1).double() / keep.clamp_min(1)
        hit = hits[..., rows].mean()
    return loss, hit


def evaluate(gate, model, sequences, args, device):
    per_layer = torch.zeros(gate.layers, dtype=torch.float64)
    with torch.no_grad():
        for seq in sequences:
            hidden = tb.layer_hidden_states(model, seq[None].to(device))
            for layer in range(gate.layers):
                per_layer[layer] += layer_terms(gate, model, hidden, layer, args.block_size,
                                                args.loss_from)[1].cpu()
    per_layer /= max(1, len(sequences))
    ranked_layers = per_layer[1:] if gate.layers > 1 else per_layer
    return ranked_layers.mean().item(), per_layer.tolist()


def save(gate, args, config, report, out_dir):
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for l in range(gate.layers):
        for name in ("q_proj", "k_max_proj", "k_min_proj", "q_norm", "k_norm"):
            suffix = "weight"
            tensors[f"layers.{l}.{name}.{suffix}"] = getattr(gate, name)[l].detach().float() \
                .cpu().contiguous()
    save_file(tensors, os.path.join(out_dir, "seer_gate.safetensors"))
    info = {"format": "kvlens-seer-gate", "version": 1, "layers": gate.layers,
            "heads": gate.heads, "kv_heads": gate.kv_heads, "head_dim": gate.head_dim,
            "gate_dim": gate.gate_dim, "block_size": args.block_size,
            "pooling": ["max", "min"], "norm_eps": NORM_EPS,
            "base_model": tb.base_model_info(args.model, config), "training": report}
    with open(os.path.join(out_dir, "seer_gate.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", nargs="+", help="training text (.txt or .jsonl; required unless "
                   "--init-only)")
    p.add_argument("--init-only", action="store_true",
                   help="write the seeded untrained gate (config.json alone is read): for test "
                        "fixtures, whose policy runs need a gate of the right shape, not a good one")
    p.add_argument("--out", help="folder for seer_gate.* (default: the model folder)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gate-dim", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--loss-from", type=float, default=0.5,
                   help="rows before this share of the sequence are not in the loss (the "
                        "authors' loss_slice_ratio)")
    p.add_argument("--eval-sequences", type=int, default=8)
    p.add_argument("--heldout-frac", type=float, default=0.02)
    p.add_argument("--doc-chars", type=int, default=6000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    for name in ("block_size", "gate_dim", "seq_len", "steps", "eval_sequences"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer")
    if args.seq_len < 3 * args.block_size:
        p.error("--seq-len: expected at least 3 blocks (3 * --block-size)")
    if not 0.0 <= args.loss_from < 1.0:
        p.error("--loss-from: expected a number in [0, 1)")
    if not args.data and not args.init_only:
        p.error("--data: expected training text files (or --init-only)")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    tp.set_determinism(args.seed, device)
    config = tb.read_config(args.model)
    layers, heads, kv_heads, head_dim = shape_of(config)
    if args.init_only:
        gate = SeerGate(layers, heads, kv_heads, head_dim, args.gate_dim)
        report = {"tool": "tools/train_seer_gate.py", "command": sys.argv[1:] if argv is None
                  else argv, "untrained": True, "seed": args.seed}
        save(gate, args, config, report, args.out or args.model)
        return report
    train_seqs, _, held_seqs, stats = tp.prepare_data(args, args.model, config)
    eval_seqs = tp.pick_eval(held_seqs, args.eval_sequences)
    if train_seqs.shape[0] == 0:
        raise SystemExit("--data: expected at least one training sequence of --seq-len tokens")
    model = tb.load_base_model(args.model, device)
    gate = SeerGate(layers, heads, kv_heads, head_dim, args.gate_dim).to(device)
    before, _ = evaluate(gate, model, eval_seqs, args, device)
    log(f"held-out block hit rate before training {before:.4f}")
    opt = torch.optim.AdamW(gate.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, tp.cosine_with_warmup(args.warmup, args.steps))
    losses = []
    for step in range(args.steps):
        seq = train_seqs[step % train_seqs.shape[0]][None].to(device)
        hidden = tb.layer_hidden_states(model, seq)
        loss = sum(layer_terms(gate, model, hidden, l, args.block_size, args.loss_from)[0]
                   for l in range(layers)) / layers
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 6))
        if step % 50 == 0 or step == args.steps - 1:
            log(f"step {step}: loss {loss.item():.4f}")
    hit, per_layer = evaluate(gate, model, eval_seqs, args, device)
    log(f"held-out block hit rate {hit:.4f} (before training {before:.4f})")
    report = {"tool": "tools/train_seer_gate.py", "command": sys.argv[1:] if argv is None else argv,
              "data": stats, "seq_len": args.seq_len, "steps": args.steps, "lr": args.lr,
              "loss": "KL(block attention share, max over the group's heads || gate softmax)",
              "loss_from": args.loss_from, "seed": args.seed, "device": str(device),
              "heldout": {"sequences": int(eval_seqs.shape[0]), "block_hit_rate": hit,
                          "block_hit_rate_untrained": before,
                          "block_hit_rate_per_layer": per_layer},
              "train_loss_first_last": [losses[0], losses[-1]],
              "seconds": round(time.time() - T0, 1)}
    save(gate, args, config, report, args.out or args.model)
    log(f"wrote {os.path.join(args.out or args.model, 'seer_gate.safetensors')}")
    return report


if __name__ == "__main__":
    main()
