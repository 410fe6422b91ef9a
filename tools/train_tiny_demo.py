#!/usr/bin/env python3
"""Train the interim bundled demo model: a small byte-level Llama on TinyStories.

Until the real demo model lands (the co-reference demo-model issue), kvlens ships this tiny
checkpoint so that a fresh install can generate text and score perplexity offline. It is a
LlamaForCausalLM (4 layers, hidden 192, 6 query heads over 2 KV heads, tied embeddings) whose
vocabulary is the 256 bytes (GPT-2 byte-to-unicode spelling, so a standard ByteLevel
tokenizer.json describes it with no merges) plus <s> and </s>.

Run on the GPU machine (PyTorch + transformers), with the corpus carried along:
    python3 tools/train_tiny_demo.py --corpus DIR/tinystories-valid.txt --out OUT_DIR
It writes config.json, model.safetensors (BF16), tokenizer.json, generation_config.json and
train_log.json into OUT_DIR. Deterministic for a given --seed on the same machine.
"""
import argparse
import json
import math
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BOS, EOS = 256, 257


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map (used by ByteLevel)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def tokenizer_json():
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab["<s>"] = BOS
    vocab["</s>"] = EOS
    special = lambda i, t: {"id": i, "content": t, "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(BOS, "<s>"), special(EOS, "</s>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [BOS], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def load_stories(path):
    text = open(path, encoding="utf-8").read()
    stories = [s.strip() for s in text.split("\n\n") if s.strip()]
    ids = []
    for story in stories:
        ids.append(BOS)
        ids.extend(story.encode("utf-8"))
        ids.append(EOS)
    return stories, torch.tensor(ids, dtype=torch.long)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=1000)  # more overfits 800 KB
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    stories, ids = load_stories(args.corpus)
    held_out = max(1, len(ids) // 50)  # last 2% of bytes for validation
    train_ids, valid_ids = ids[:-held_out].to(device), ids[-held_out:].to(device)

    config = LlamaConfig(vocab_size=258, hidden_size=192, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                         max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS)
    model = LlamaForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.05)
    warmup = 200
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def batch(source):
        starts = torch.randint(0, len(source) - args.seq - 1, (args.batch,), device=device)
        offsets = torch.arange(args.seq + 1, device=device)
        window = source[starts[:, None] + offsets[None, :]]
        return window[:, :-1], window[:, 1:]

    log = []
    start = time.time()
    model.train()
    for step in range(args.steps):
        x, y = batch(train_ids)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 250 == 0 or step == args.steps - 1:
            model.eval()
            with torch.no_grad():
                vx, vy = batch(valid_ids)
                vlogits = model(input_ids=vx).logits.float()
                vloss = torch.nn.functional.cross_entropy(vlogits.reshape(-1, vlogits.size(-1)), vy.reshape(-1))
            model.train()
            entry = {"step": step, "train_loss": loss.item(), "valid_loss": vloss.item(),
                     "seconds": round(time.time() - start, 1)}
            log.append(entry)
            print(json.dumps(entry), flush=True)

    os.makedirs(args.out, exist_ok=True)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(args.out, safe_serialization=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    prompt = torch.tensor([[BOS] + list("Once upon a time".encode())], device=device)
    with torch.no_grad():
        sample = model.generate(prompt, max_new_tokens=200, do_sample=False)[0].tolist()
    text = bytes(t for t in sample if t < 256).decode("utf-8", errors="replace")
    print("sample:", text, flush=True)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"args": vars(args), "config": config.to_dict(), "log": log,
                   "params": sum(p.numel() for p in model.parameters()),
                   "torch": torch.__version__, "sample": text,
                   "stories": len(stories)}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
