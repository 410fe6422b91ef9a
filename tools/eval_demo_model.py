#!/usr/bin/env python3
"""Reference evaluation of a kvlens demo model with Hugging Face transformers (F32, on a GPU when
there is one): the figures kvlens-cli must reproduce, plus an analysis of the attention heads.

Figures (each defined exactly as kvlens-cli eval computes it, so the two can be compared):
  * co-reference accuracy / coverage (POLICIES.md): teacher-forced; at each position that predicts
    a token of the final mention, argmax == true token. Samples come from
    `kvlens-cli coref-samples` (JSON lines with "text", "answer_char_begin" in UTF-8 bytes). The
    answer's tokens are located as engine/eval/coref_benchmark.h does: the text is cut before the
    space preceding the answer, the prefix (with BOS) must be a token-prefix of the whole encoding;
    otherwise prefix and answer are encoded separately and concatenated (non-canonical).
  * perplexity of a text file: tokens = encode(text) with BOS; windows of W tokens start at
    k*(W-1), each scored from an empty cache, so every token but the first is predicted once.
Attention analysis (eager attention, probabilities after softmax), per (layer, head):
  * sink: mean attention paid to position 0 (BOS) by queries at positions >= 16;
  * previous-token: mean attention paid to position q-1;
  * induction: on 64 sequences of 48 random tokens repeated twice, mean attention from each token
    of the second copy to the token after its first occurrence (the token to be predicted);
  * retrieval: at the co-reference scored positions, attention paid to the first-mention token
    that the position must predict (and the total mass on the first mention);
  * hard samples: mass on the asked location's first mention vs. the other locations' mentions.

Usage (GPU machine):
    python3 tools/eval_demo_model.py --model assets/models/demo --coref coref-eval.jsonl \\
        --coref-hard coref-eval-hard.jsonl --train-coref .carry/coref-train.jsonl \\
        --train-coref .carry/coref-train-hard.jsonl \\
        --text wikitext2-test=../shared/data/eval/wikitext2-test.txt \\
        --text heldback=heldback.txt --out eval.json --per-sample coref-per-sample.jsonl
"""
import argparse
import json
import math
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mark_answer(tok, sample):
    """(ids, answer_begin, answer_end, canonical) as engine/eval/coref_benchmark.cpp does."""
    text = sample["text"]
    raw = text.encode("utf-8")
    begin = sample["answer_char_begin"]
    cut = begin
    while cut > 0 and raw[cut - 1:cut] in (b" ", b"\t", b"\n"):
        cut -= 1
    prefix, answer_part = raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")
    whole = tok.encode(text, add_special_tokens=True).ids
    pre = tok.encode(prefix, add_special_tokens=True).ids
    if whole[:len(pre)] == pre:
        return whole, len(pre), len(whole), True
    ans = tok.encode(answer_part, add_special_tokens=False).ids
    return pre + ans, len(pre), len(pre) + len(ans), False


def first_mention_positions(tok, sample, ids, answer_ids):
    """Token positions of the first mention of the asked location ("The place is: X."), or None."""
    text = sample["text"]
    needle = "The place is: " + sample["answer"] + "."
    at = text.find(needle)
    if at < 0:
        return None
    loc_begin = at + len("The place is:")  # the space before the name belongs to its first token
    enc = tok.encode(text, add_special_tokens=True)
    loc_end = loc_begin + 1 + len(sample["answer"])
    span = [i for i, (s, e) in enumerate(enc.offsets)
            if enc.special_tokens_mask[i] == 0 and s >= loc_begin and e <= loc_end]
    if [ids[i] for i in span] != list(answer_ids):
        return None
    return span


def other_mentions(tok, sample):
    """Token spans of the other locations' first mentions (hard samples)."""
    text = sample["text"]
    enc = tok.encode(text, add_special_tokens=True)
    spans = []
    start = 0
    while True:
        at = text.find("The place is: ", start)
        if at < 0:
            break
        end = text.find(".", at + len("The place is: "))
        name = text[at + len("The place is: "):end]
        start = end
        if name == sample["answer"]:
            continue
        lb = at + len("The place is:")
        spans.append([i for i, (s, e) in enumerate(enc.offsets)
                      if enc.special_tokens_mask[i] == 0 and s >= lb and e <= end])
    return spans


@torch.no_grad()
def coref_eval(model, tok, samples, device, attn_stats=None):
    per_sample, n_ok, n_tok_ok, n_tok = [], 0, 0, 0
    for s in samples:
        ids, a0, a1, canonical = mark_answer(tok, s)
        x = torch.tensor([ids], device=device)
        out = model(input_ids=x, output_attentions=attn_stats is not None)
        logits = out.logits[0].float()
        pos = torch.arange(a0 - 1, a1 - 1, device=device)
        pred = logits[pos].argmax(-1)
        tgt = x[0, a0:a1]
        right = (pred == tgt)
        lp = torch.log_softmax(logits[pos].double(), -1).gather(1, tgt[:, None])[:, 0]
        ok = bool(right.all())
        n_ok += ok
        n_tok_ok += int(right.sum())
        n_tok += a1 - a0
        per_sample.append({"index": s["index"], "answer": s["answer"], "tokens": len(ids),
                           "answer_token_begin": a0, "answer_token_end": a1,
                           "correct_tokens": int(right.sum()), "all_correct": ok,
                           "canonical": canonical, "answer_nll": float(-lp.sum())})
        if attn_stats is not None:
            attn_stats(s, ids, a0, a1, out.attentions)
    n = max(len(samples), 1)
    return {"accuracy": n_ok / n, "coverage": n_tok_ok / max(n_tok, 1), "samples": len(samples),
            "answer_tokens": n_tok}, per_sample


@torch.no_grad()
def perplexity(model, tok, path, window, device, batch=16):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids = tok.encode(text, add_special_tokens=True).ids
    starts = list(range(0, len(ids), window - 1))
    wins = [ids[s:s + window] for s in starts]
    wins = [w for w in wins if len(w) >= 2]
    nll_sum, n = 0.0, 0
    for i in range(0, len(wins), batch):
        part = wins[i:i + batch]
        L = max(len(w) for w in part)
        x = torch.zeros((len(part), L), dtype=torch.long)
        valid = torch.zeros((len(part), L), dtype=torch.bool)
        for j, w in enumerate(part):
            x[j, :len(w)] = torch.tensor(w)
            valid[j, :len(w)] = True
        x, valid = x.to(device), valid.to(device)
        logits = model(input_ids=x).logits.double()
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                              reduction="none").view(x.shape[0], -1)
        m = valid[:, 1:]
        nll_sum += float((nll * m).sum())
        n += int(m.sum())
    return {"file": path, "chars": len(text), "tokens": len(ids), "window": window,
            "windows": len(wins), "tokens_scored": n, "mean_nll": nll_sum / n,
            "ppl": math.exp(nll_sum / n)}


class HeadStats:
    """Running per-(layer, head) means of the attention patterns listed in the module doc."""

    def __init__(self, layers, heads):
        z = lambda: np.zeros((layers, heads))
        self.sum = {k: z() for k in ("sink", "prev", "retrieval", "retrieval_mass",
                                       "hard_asked_mass", "hard_other_mass")}
        self.cnt = {k: 0 for k in self.sum}

    def add(self, key, value, count):
        self.sum[key] += value
        self.cnt[key] += count

    def mean(self, key):
        return self.sum[key] / max(self.cnt[key], 1)


def generic_patterns(stats, attentions, skip=16):
    for li, a in enumerate(attentions):
        a = a[0].float()  # [H, T, T]
        T = a.shape[-1]
        if T > skip:
            stats.sum["sink"][li] += a[:, skip:, 0].sum(-1).cpu().numpy()
        idx = torch.arange(1, T, device=a.device)
        stats.sum["prev"][li] += a[:, idx, idx - 1].sum(-1).cpu().numpy()
    T = attentions[0].shape[-1]
    stats.cnt["sink"] += max(T - skip, 0)
    stats.cnt["prev"] += T - 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--coref", required=True, help="normal samples (.jsonl from coref-samples)")
    ap.add_argument("--coref-hard", default="", help="hard samples (.jsonl)")
    ap.add_argument("--train-coref", action="append", default=[],
                    help="training samples (.jsonl), to check the evaluation set is disjoint")
    ap.add_argument("--text", action="append", default=[], help="NAME=FILE for perplexity")
    ap.add_argument("--window", type=int, default=0, help="perplexity window (0 = model context)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-sample", default="")
    ap.add_argument("--reference-out", default="",
                    help="also write the small parity fixture tests/parity/test_demo_model.cpp "
                         "reads: greedy continuations of --prompt, their per-token NLL, and the "
                         "first 20 co-reference samples' results")
    ap.add_argument("--prompt", action="append", default=[], help="prompt for --reference-out")
    ap.add_argument("--max-new", type=int, default=48)
    args = ap.parse_args()

    import tokenizers
    import transformers
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                             attn_implementation="eager").to(device).eval()
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    window = args.window or cfg.max_position_embeddings
    result = {"model": args.model, "device": str(device),
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__}}

    samples = read_jsonl(args.coref)
    train_texts = set()
    for p in args.train_coref:
        train_texts.update(s["text"] for s in read_jsonl(p))
    stats = HeadStats(L, H)

    def coref_attention(s, ids, a0, a1, attentions):
        generic_patterns(stats, attentions)
        span = first_mention_positions(tok, s, ids, ids[a0:a1])
        if span is None:
            return
        for li, a in enumerate(attentions):
            a = a[0].float()
            for j, p in enumerate(range(a0 - 1, a1 - 1)):
                stats.sum["retrieval"][li] += a[:, p, span[j]].cpu().numpy()
                stats.sum["retrieval_mass"][li] += a[:, p, span].sum(-1).cpu().numpy()
        stats.cnt["retrieval"] += a1 - a0
        stats.cnt["retrieval_mass"] += a1 - a0

    t = time.time()
    coref, per_sample = coref_eval(model, tok, samples, device, coref_attention)
    coref["overlap_with_training"] = sum(s["text"] in train_texts for s in samples)
    coref["seconds"] = round(time.time() - t, 1)
    result["coref"] = coref
    log(f"coref normal: {json.dumps(coref)}")

    if args.coref_hard:
        hard_samples = read_jsonl(args.coref_hard)

        def hard_attention(s, ids, a0, a1, attentions):
            span = first_mention_positions(tok, s, ids, ids[a0:a1])
            others = other_mentions(tok, s)
            if span is None or not others:
                return
            for li, a in enumerate(attentions):
                a = a[0].float()
                for p in range(a0 - 1, a1 - 1):
                    stats.sum["hard_asked_mass"][li] += a[:, p, span].sum(-1).cpu().numpy()
                    stats.sum["hard_other_mass"][li] += sum(
                        a[:, p, o].sum(-1) for o in others).cpu().numpy() / len(others)
            stats.cnt["hard_asked_mass"] += a1 - a0
            stats.cnt["hard_other_mass"] += a1 - a0

        hard, hard_per_sample = coref_eval(model, tok, hard_samples, device, hard_attention)
        hard["overlap_with_training"] = sum(s["text"] in train_texts for s in hard_samples)
        result["coref_hard"] = hard
        log(f"coref hard: {json.dumps(hard)}")

    # Induction: random token sequences repeated twice.
    g = torch.Generator().manual_seed(0)
    half, reps = 48, 64
    ind = np.zeros((L, H))
    with torch.no_grad():
        for _ in range(reps):
            r = torch.randint(2, cfg.vocab_size, (half,), generator=g)
            x = torch.cat([torch.tensor([cfg.bos_token_id]), r, r])[None].to(device)
            atts = model(input_ids=x, output_attentions=True).attentions
            q = torch.arange(1 + half, 1 + 2 * half, device=device)  # second copy
            target = q - half + 1  # the token after the first occurrence
            q, target = q[:-1], target[:-1]
            for li, a in enumerate(atts):
                ind[li] += a[0].float()[:, q, target].mean(-1).cpu().numpy()
    ind /= reps
    # Loss on the second copy shows whether the model copies at all.
    with torch.no_grad():
        x = torch.cat([torch.tensor([cfg.bos_token_id]), r, r])[None].to(device)
        lg = model(input_ids=x).logits[0].double()
        nll = F.cross_entropy(lg[:-1], x[0, 1:], reduction="none")
        result["repeat_nll"] = {"first_copy": float(nll[:half].mean()),
                                "second_copy": float(nll[half + 1:].mean())}

    heads = {"sink": stats.mean("sink"), "previous_token": stats.mean("prev"),
             "induction": ind, "retrieval": stats.mean("retrieval"),
             "retrieval_mass": stats.mean("retrieval_mass")}
    if stats.cnt["hard_asked_mass"]:
        heads["hard_asked_mass"] = stats.mean("hard_asked_mass")
        heads["hard_other_mass"] = stats.mean("hard_other_mass")
    result["heads"] = {k: np.round(v, 4).tolist() for k, v in heads.items()}
    for k, v in heads.items():
        order = np.dstack(np.unravel_index(np.argsort(-v, axis=None), v.shape))[0][:6]
        top = ", ".join(f"L{l}H{h} {v[l, h]:.3f}" for l, h in order)
        log(f"top {k}: {top}   (median {np.median(v):.3f})")

    result["perplexity"] = {}
    for spec in args.text:
        name, path = spec.split("=", 1)
        t = time.time()
        r = perplexity(model, tok, path, window, device)
        r["seconds"] = round(time.time() - t, 1)
        result["perplexity"][name] = r
        log(f"ppl {name}: {json.dumps(r)}")

    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.reference_out:
        ref = {"model": args.model, "made_by": "tools/eval_demo_model.py --reference-out",
               "versions": result["versions"], "device": str(device), "dtype": "float32",
               "prompts": [], "coref": per_sample[:20]}
        for prompt in args.prompt:
            ids = tok.encode(prompt, add_special_tokens=True).ids
            x = torch.tensor([ids], device=device)
            with torch.no_grad():
                out = model.generate(input_ids=x, max_new_tokens=args.max_new, do_sample=False,
                                     eos_token_id=cfg.eos_token_id, pad_token_id=cfg.eos_token_id)
                seq = out[0].tolist()
                lg = model(input_ids=out).logits[0].double()
            nll = F.cross_entropy(lg[:-1], out[0, 1:], reduction="none")
            ref["prompts"].append({"prompt": prompt, "prompt_tokens": ids,
                                   "generated": seq[len(ids):],
                                   "text": tok.decode(seq, skip_special_tokens=True),
                                   "nll": [round(float(v), 6) for v in nll]})
            log(f"reference: {ref['prompts'][-1]['text']!r}")
        with open(args.reference_out, "w") as f:
            json.dump(ref, f, indent=1)
    if args.per_sample:
        with open(args.per_sample, "w") as f:
            for r in per_sample:
                f.write(json.dumps(r) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
