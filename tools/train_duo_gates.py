#!/usr/bin/env python3
"""Optimises DuoAttention's head gates for a kvlens model folder (docs/policies/duoattention.md)
and writes duo_gates.safetensors beside the model: tensor "gates", F32 [layers, kv_heads], each in
[0, 1] (high: a retrieval head), with the recipe in the file's metadata.

Recipe (Xiao et al. 2024, the authors' duo_attn/train.py, data.py and loss.py, re-written):
  * One gate per (layer, KV head), starting at 1. In the gated model every attention output is
    gate * full causal attention + (1 - gate) * streaming attention (the query sees the first
    --sink-tokens and the last --recent-tokens keys, itself included), per KV head (its query
    heads share the gate). The model's weights stay frozen.
  * Data: synthetic passkey retrieval. A haystack of corpus text (--data, .txt or .jsonl, read
    with tools/corpus_text.py) of --seq-len tokens holds --num-passkeys needles ("The N-th pass
    key is DDDDD. Remember it.") at evenly spread random depths; the sequence ends with the
    questions and answers ("What is the N-th pass key? The N-th pass key is DDDDD."). Digits are
    random (seeded).
  * Loss: the mean over the answer positions (the states that predict each answer token) of the
    mean squared difference between the final hidden states of the full model and of the gated
    one, plus --reg (0.05) times the mean |gate|. AdamW (lr --lr, weight decay 0), the authors'
    schedule (linear warm-up over a fifth of the steps, flat, linear decay over the last fifth,
    never below a tenth); the gates are clamped to [0, 1] before every step, as theirs.
  * Deterministic: --seed seeds the data and torch; on the CPU two runs write identical files.

Demo model (CPU, about two minutes on two cores; the command that rebuilds the committed file):
    python3 tools/train_duo_gates.py --model assets/models/demo \\
        --data ../shared/data/corpus/gutenberg-00.txt ../shared/data/corpus/gutenberg-01.txt \\
        --reg 0.5
On the GPU machine: add --device cuda (and copy the corpus into the repository first).
"""

import argparse
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402
from corpus_text import read_documents  # noqa: E402

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
            "tenth"]

# The gated attention reads these while the model runs: None = plain full attention (the
# reference forward), else the gates [layers, kv_heads] and the streaming window.
GATED = {"gates": None, "sinks": 0, "recent": 1}


def log(msg):
    print(f"[train_duo_gates] {msg}", flush=True)


def streaming_mask(length, sinks, recent, device):
    """[T, T] bool: query i sees key j <= i with j < sinks or i - j < recent."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < recent))


def duo_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
    """transformers' attention interface: query [B, H, T, D], key/value [B, G, T, D] ->
    ([B, T, H, D], None); full causal attention mixed with streaming attention per KV head."""
    heads, kv_heads, length = query.shape[1], key.shape[1], query.shape[2]
    group = heads // kv_heads
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale
    causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    full = torch.matmul(logits.masked_fill(~causal, float("-inf")).softmax(-1), value)
    if GATED["gates"] is None:
        return full.transpose(1, 2).contiguous(), None
    stream_mask = streaming_mask(length, GATED["sinks"], GATED["recent"], query.device)
    stream = torch.matmul(logits.masked_fill(~stream_mask, float("-inf")).softmax(-1), value)
    gate = GATED["gates"][module.layer_idx].repeat_interleave(group)[None, :, None, None]
    mixed = gate * full + (1.0 - gate) * stream
    return mixed.transpose(1, 2).contiguous(), None


def passkey_sample(rng, haystack_ids, encode, length, num_passkeys, bos):
    """(ids [length], answer positions): needles spread through a haystack slice, questions and
    answers at the end; the positions are those whose hidden state predicts an answer token."""
    keys = ["".join(rng.choice("0123456789") for _ in range(5)) for _ in range(num_passkeys)]
    needles = [encode(f" The {ORDINALS[n]} pass key is {k}. Remember it. ")
               for n, k in enumerate(keys)]
    tail, answers = [], []
    for n, k in enumerate(keys):
        tail += encode(f" What is the {ORDINALS[n]} pass key? The {ORDINALS[n]} pass key is")
        answer = encode(f" {k}.")
        answers.append((len(tail), len(answer)))
        tail += answer
    head = [bos] if bos is not None else []
    hay_len = length - len(head) - len(tail) - sum(len(x) for x in needles)
    if hay_len < num_passkeys:
        raise SystemExit(f"--seq-len {length}: too short for {num_passkeys} passkeys and their "
                         f"questions ({length - hay_len} tokens)")
    start = rng.randrange(0, len(haystack_ids) - hay_len)
    hay = haystack_ids[start:start + hay_len]
    # Needle n goes at a random depth inside the n-th equal part of the haystack.
    cuts = sorted(rng.randrange(n * hay_len // num_passkeys, (n + 1) * hay_len // num_passkeys)
                  for n in range(num_passkeys))
    ids, last = list(head), 0
    for cut, needle in zip(cuts, needles):
        ids += hay[last:cut] + needle
        last = cut
    ids += hay[last:]
    tail_start = len(ids)
    ids += tail
    positions = [tail_start + begin - 1 + i for begin, count in answers for i in range(count)]
    return ids, positions


def schedule(steps):
    fifth = max(1, steps // 5)
    return lambda s: min(1.0, max((s + 1) / fifth, 0.1), max((steps - s) / fifth, 0.1))


def train(args):
    import tokenizers
    import transformers

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    if args.device == "cpu":
        # One thread: a BLAS that adapts its thread count to the machine's load would otherwise
        # sum in a different order from run to run (unit:tools saw two runs differ under load).
        torch.set_num_threads(1)
    rng = random.Random(args.seed)
    device = torch.device(args.device)
    config = tb.read_config(args.model)
    layers, kv_heads = config["num_hidden_layers"], config.get(
        "num_key_value_heads", config["num_attention_heads"])
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    haystack = []
    for path in args.data:
        for doc in read_documents(path, 4000):
            haystack += encode(doc + "\n\n")
            if len(haystack) >= args.haystack_tokens:
                break
        if len(haystack) >= args.haystack_tokens:
            break
    if len(haystack) < 2 * args.seq_len:
        raise SystemExit(f"--data: {len(haystack)} tokens of text, need at least "
                         f"{2 * args.seq_len} (twice --seq-len)")
    bos = config.get("bos_token_id")
    bos = bos[0] if isinstance(bos, list) else bos

    transformers.AttentionInterface.register("kvlens_duo", duo_attention)
    model = tb.load_base_model(args.model, device, attn_implementation="kvlens_duo")
    gates = torch.nn.Parameter(torch.full((layers, kv_heads), args.initial_gate, device=device))
    optimizer = torch.optim.AdamW([gates], lr=args.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(args.steps))
    GATED.update(sinks=args.sink_tokens, recent=args.recent_tokens)
    history = []
    start = time.time()
    for step in range(args.steps):
        with torch.no_grad():
            gates.clamp_(0.0, 1.0)
        ids, positions = passkey_sample(rng, haystack, encode, args.seq_len, args.num_passkeys,
                                        bos)
        x = torch.tensor([ids], device=device)
        GATED["gates"] = None
        with torch.no_grad():
            full = model.model(input_ids=x).last_hidden_state[0, positions]
        GATED["gates"] = gates
        gated = model.model(input_ids=x).last_hidden_state[0, positions]
        distill = (full - gated).pow(2).mean(dim=-1).mean()
        reg = gates.abs().mean()
        loss = distill + args.reg * reg
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        history.append({"step": step, "distill": distill.item(), "reg": reg.item()})
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            log(f"step {step}: distill {distill.item():.5f} reg {reg.item():.3f} "
                f"({time.time() - start:.0f}s)")
    GATED["gates"] = None
    with torch.no_grad():
        gates.clamp_(0.0, 1.0)
    return gates.detach().float().cpu().contiguous(), history


def save(path, gates, args, history):
    from safetensors.torch import save_file
    recipe = {"sink_tokens": args.sink_tokens, "recent_tokens": args.recent_tokens,
              "steps": args.steps, "seq_len": args.seq_len, "num_passkeys": args.num_passkeys,
              "lr": args.lr, "reg": args.reg, "initial_gate": args.initial_gate,
              "seed": args.seed, "data": [os.path.basename(p) for p in args.data],
              "final_distill": history[-1]["distill"], "final_reg": history[-1]["reg"]}
    # One metadata key: safetensors writes a dict's keys in an order of its own, which differs
    # from run to run, so two keys would make two runs' bytes differ.
    recipe["format"] = "kvlens-duo-gates"
    save_file({"gates": gates}, path, metadata={"recipe": json.dumps(recipe, sort_keys=True)})


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="kvlens model folder (config.json, weights, "
                   "tokenizer.json)")
    p.add_argument("--data", nargs="+", required=True, help="corpus files for the haystack")
    p.add_argument("--out", help="output file (default: MODEL/duo_gates.safetensors)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--num-passkeys", type=int, default=4)
    p.add_argument("--sink-tokens", type=int, default=4)
    p.add_argument("--recent-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--reg", type=float, default=0.05)
    p.add_argument("--initial-gate", type=float, default=1.0)
    p.add_argument("--haystack-tokens", type=int, default=200000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    for name in ("steps", "seq_len", "num_passkeys", "recent_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got "
                    f"{getattr(args, name)}")
    if args.num_passkeys > len(ORDINALS):
        p.error(f"--num-passkeys: expected at most {len(ORDINALS)}, got {args.num_passkeys}")
    if not 0.0 <= args.initial_gate <= 1.0:
        p.error(f"--initial-gate: expected a value in [0, 1], got {args.initial_gate}")
    return args


def main(argv=None):
    args = parse_args(argv)
    out = args.out or os.path.join(args.model, "duo_gates.safetensors")
    gates, history = train(args)
    save(out, gates, args, history)
    order = sorted(range(gates.numel()), key=lambda i: -float(gates.view(-1)[i]))
    kv = gates.shape[1]
    top = ", ".join(f"L{i // kv}G{i % kv} {float(gates.view(-1)[i]):.2f}" for i in order[:5])
    log(f"wrote {out}: gates {tuple(gates.shape)}, mean {gates.mean().item():.3f}; top {top}")
    if math.isnan(history[-1]["distill"]):
        raise SystemExit("training diverged (NaN loss)")


if __name__ == "__main__":
    main()
