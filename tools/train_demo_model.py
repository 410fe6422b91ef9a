#!/usr/bin/env python3
"""Train the bundled kvlens demo model: a byte-level BPE tokenizer plus a small Llama that has
learned the co-reference (retrieval) task used by kvlens' co-reference benchmark.

What it does
  1. Reads the corpus (Gutenberg books, C4 realnewslike sample, TinyStories, tinyshakespeare) and
     the co-reference samples exported by the C++ generator (JSON lines, field "text").
  2. Holds back the last 1% (by characters, at a document boundary) of every corpus file and the
     last --coref-val (500) samples of each co-reference file (normal and hard) for validation.
  3. Trains a byte-level BPE tokenizer (HF `tokenizers`: ByteLevel pre-tokenizer with the GPT-2
     split regex, ByteLevel decoder, specials <s>=0 and </s>=1, a TemplateProcessing
     post-processor that prepends <s>) on the training part of the corpus text.
  4. Trains a LlamaForCausalLM (8 layers, hidden 256, 8 query / 4 KV heads, intermediate 688,
     tied embeddings, rope_theta 10000, max_position_embeddings 1024).
     Batches: each step holds --batch sequences; --coref-frac (a third) of them are
     co-reference samples, the rest corpus sequences.
       * Corpus: documents, each as <s> text </s>, shuffled (seeded) and concatenated into one
         stream that is cut into consecutive 1024-token sequences, the model's whole context
         (documents are packed; attention is plain causal across document boundaries).
       * Co-reference: each sample is its own sequence <s> text </s>, right-padded with </s> to the
         longest sample; padding positions carry no loss (labels masked), and since attention is
         causal the padding after a sample never influences it, so no attention mask is needed.
         Answer tokens (the final mention) may get extra loss weight (--answer-weight).
     Loss: token-weighted mean cross entropy over both parts. AdamW (weight decay on matrices
     only), linear warmup + cosine decay to --min-lr-ratio, bf16 autocast, grad clip 1.0.
  5. Evaluates every --eval-every steps: validation loss on held-out corpus text and
     teacher-forced co-reference accuracy on the held-out samples, separately for normal and hard
     samples. The answer is the text after the last ": "; at every position that predicts one of
     its tokens the argmax must equal the true token. accuracy = fraction of samples with all answer tokens right; coverage = fraction
     of answer tokens right.
     The model saved is the evaluated checkpoint with the lowest held-out corpus loss among those
     with normal co-reference accuracy >= --select-min-coref-acc (the corpus is small and overfits).
  6. Writes into --out (flat): config.json, model.safetensors (BF16), generation_config.json,
     tokenizer.json, train_log.json (args, per-eval losses/accuracies, timing, versions).

Determinism: all seeds come from --seed; the data order is a pure function of (seed, step).
Resumable: every --ckpt-every steps the model, optimizer, step and logs go to
--work-dir/ckpt.pt; a later run with the same --work-dir resumes from it.

How to run (on the GPU machine, with the git-ignored .carry folder carried along):
    python3 tools/train_demo_model.py --data-dir .carry --out $OUT/model \\
        --work-dir /tmp/kvlens-demo-work --heldback-out $OUT/heldback.txt
Smoke test:
    python3 tools/train_demo_model.py --data-dir .carry --out /tmp/smoke --steps 50 \\
        --eval-every 25
"""
import argparse
import glob
import inspect
import json
import math
import os
import platform
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_text import group_blocks, split_blocks  # noqa: E402

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:8.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- data

def holdout_tail(docs, frac):
    """Split docs into (train, val): val = the trailing docs holding >= frac of the characters."""
    total = sum(len(d) for d in docs)
    need = frac * total
    acc, k = 0, len(docs)
    while k > 1 and acc < need:
        k -= 1
        acc += len(docs[k])
    return docs[:k], docs[k:]


def load_corpus(data_dir, args):
    sources = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "gutenberg-*.txt"))):
        with open(path, encoding="utf-8") as f:
            sources[os.path.basename(path)] = group_blocks(split_blocks(f.read()),
                                                           args.gutenberg_doc_chars)
    path = os.path.join(data_dir, "c4-realnewslike-sample.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            sources[os.path.basename(path)] = [json.loads(l)["text"].strip() for l in f if l.strip()]
    path = os.path.join(data_dir, "tinystories-valid.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            sources[os.path.basename(path)] = split_blocks(f.read())
    path = os.path.join(data_dir, "tinyshakespeare.txt")
    if os.path.exists(path):
        # Speeches are short blocks; group them into scenes-sized documents like the books.
        with open(path, encoding="utf-8") as f:
            sources[os.path.basename(path)] = group_blocks(split_blocks(f.read()),
                                                           args.gutenberg_doc_chars)
    if not sources:
        sys.exit(f"no corpus files found in {data_dir}")
    train, val, stats = [], [], {}
    for name, docs in sources.items():
        docs = [d for d in docs if d.strip()]
        tr, va = holdout_tail(docs, args.val_frac)
        train += tr
        val += va
        stats[name] = {"docs": len(docs), "chars": sum(len(d) for d in docs),
                       "train_docs": len(tr), "val_docs": len(va),
                       "val_chars": sum(len(d) for d in va)}
    return train, val, stats


def load_coref(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l)["text"] for l in f if l.strip()]


# ----------------------------------------------------------------------------- tokenizer

def build_tokenizer(train_docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    bos = tok.token_to_id("<s>")
    eos = tok.token_to_id("</s>")
    assert bos == 0 and eos == 1, (bos, eos)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", bos)])
    return tok


def tokenize_docs(tok, docs, bos, eos):
    encs = tok.encode_batch(docs, add_special_tokens=False)
    return [[bos] + e.ids + [eos] for e in encs]


def tokenize_coref(tok, texts, eos):
    """Returns [(seq, answer_mask)]: seq = <s> ids </s>; answer_mask[i] true where seq[i] is an
    answer token (a token of the text after the last ': ')."""
    encs = tok.encode_batch(texts, add_special_tokens=True)
    out, bad = [], 0
    for text, e in zip(texts, encs):
        a = text.rfind(": ")
        assert a >= 0, text
        mask = [(s == 0 and off[1] > a + 1) for off, s in zip(e.offsets, e.special_tokens_mask)]
        ids = list(e.ids)
        ans_ids = [t for t, m in zip(ids, mask) if m]
        if not ans_ids or tok.decode(ans_ids).strip() != text[a + 2:].strip():
            bad += 1
        out.append((ids + [eos], mask + [False]))
    return out, bad


# ----------------------------------------------------------------------------- model / eval

def make_config(vocab_size, bos, eos, args):
    from transformers import LlamaConfig
    kw = dict(vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
              num_hidden_layers=args.layers, num_attention_heads=args.heads,
              num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
              max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=bos, eos_token_id=eos, hidden_act="silu", attention_bias=False,
              mlp_bias=False, attention_dropout=getattr(args, "attention_dropout", 0.0),
              initializer_range=0.02)
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    return LlamaConfig(**kw)


@torch.no_grad()
def eval_corpus(model, chunks, bsz=64):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, chunks.shape[0], bsz):
        x = chunks[i:i + bsz]
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                               x[:, 1:].reshape(-1), reduction="sum")
        tot += loss.item()
        n += x[:, 1:].numel()
    model.train()
    return tot / max(n, 1)


@torch.no_grad()
def eval_coref(model, samples, pad_id, device, bsz=125):
    model.eval()
    n_ok, n_tok_ok, n_tok, loss_sum, loss_n = 0, 0, 0, 0.0, 0
    for i in range(0, len(samples), bsz):
        part = samples[i:i + bsz]
        L = max(len(s) for s, _ in part)
        x = torch.full((len(part), L), pad_id, dtype=torch.long)
        m = torch.zeros((len(part), L), dtype=torch.bool)
        valid = torch.zeros((len(part), L), dtype=torch.bool)
        for j, (s, am) in enumerate(part):
            x[j, :len(s)] = torch.tensor(s)
            m[j, :len(am)] = torch.tensor(am)
            valid[j, :len(s)] = True
        x, m, valid = x.to(device), m.to(device), valid.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        tgt, mm, vv = x[:, 1:], m[:, 1:], valid[:, 1:]
        pred = logits[:, :-1].argmax(-1)
        ok = (pred == tgt) & mm
        n_ok += (ok.sum(1) == mm.sum(1)).sum().item()
        n_tok_ok += ok.sum().item()
        n_tok += mm.sum().item()
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                             tgt.reshape(-1), reduction="none").view(tgt.shape)
        loss_sum += (ce * vv).sum().item()
        loss_n += vv.sum().item()
    model.train()
    return {"accuracy": n_ok / max(len(samples), 1), "coverage": n_tok_ok / max(n_tok, 1),
            "loss": loss_sum / max(loss_n, 1), "samples": len(samples), "answer_tokens": n_tok}


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def schedule(n, bsz, steps, seed):
    """Index table [steps, bsz]: consecutive epochs of seeded permutations of range(n)."""
    need = steps * bsz
    out, e = [], 0
    while sum(len(o) for o in out) < need:
        out.append(np.random.default_rng([seed, e]).permutation(n))
        e += 1
    return np.concatenate(out)[:need].reshape(steps, bsz)


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=".carry")
    ap.add_argument("--out", required=True, help="output folder for the model files (flat)")
    ap.add_argument("--work-dir", default="/tmp/kvlens-demo-work", help="checkpoint folder")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=48, help="sequences per step (corpus + coref)")
    ap.add_argument("--coref-frac", type=float, default=1 / 3)
    ap.add_argument("--answer-weight", type=float, default=2.0,
                    help="loss weight of answer tokens in co-reference samples")
    ap.add_argument("--copy-batch", type=int, default=0,
                    help="extra sequences per step of random vocabulary tokens said twice, scored on the "
                         "repeat: exact copying of any token, not only the pools' names")
    ap.add_argument("--copy-len", type=int, nargs=2, default=[16, 192], metavar=("MIN", "MAX"),
                    help="tokens in each copy sequence's first half, drawn per step")
    ap.add_argument("--context-copy-batch", type=int, default=0,
                    help="extra sequences per step of natural text with a new name said once after "
                         "an introduction and asked for at the end: retrieval inside real prose, "
                         "not only inside the generator's sentences")
    ap.add_argument("--attention-dropout", type=float, default=0.0,
                    help="dropout on the attention probabilities while training (the saved config "
                         "has none): a copy done by one sharp head in one layer breaks when a "
                         "sparse policy misses its key; dropout makes the model copy with several")
    ap.add_argument("--init-from", default="",
                    help="start from this saved model folder (a second, fine-tuning stage with its "
                         "own schedule) instead of random weights; its config must match")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--val-frac", type=float, default=0.01)
    ap.add_argument("--coref-val", type=int, default=500, help="held-out samples per coref file")
    ap.add_argument("--gutenberg-doc-chars", type=int, default=6000)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--ckpt-every", type=int, default=800)
    ap.add_argument("--select-min-coref-acc", type=float, default=0.95,
                    help="the model saved is the evaluated checkpoint with the lowest held-out "
                         "corpus loss among those with at least this normal co-reference accuracy")
    ap.add_argument("--heldback-out", default="",
                    help="also write the held-back corpus documents (joined by blank lines) here")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a toy-size check")
    ap.add_argument("--tokenizer", default="",
                    help="an existing tokenizer.json to keep (default: train one, cached in "
                         "--work-dir)")
    ap.add_argument("--coref-train", nargs="+", default=[],
                    help="co-reference training samples (JSON lines); with --coref-select")
    ap.add_argument("--coref-select", nargs="+", default=[], metavar="KIND=FILE",
                    help="selection samples by kind (normal=FILE hard=FILE), from pools of "
                         "their own; without it the last --coref-val samples of "
                         "DATA_DIR/coref-train(-hard).jsonl are held out instead")
    ap.add_argument("--max-train-seconds", type=float, default=0,
                    help="stop training early (then evaluate and save) after this many seconds")
    args = ap.parse_args()
    if bool(args.coref_train) != bool(args.coref_select):
        ap.error("--coref-train and --coref-select go together")
    if args.coref_select and not any(x.startswith("normal=") for x in args.coref_select):
        ap.error("--coref-select needs a normal=FILE entry (the selection rule reads it)")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    assert not on_gpu or torch.cuda.is_available(), "--device cuda needs a CUDA GPU"
    os.makedirs(args.work_dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)

    import tokenizers
    import transformers
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaForCausalLM

    # ---- data + tokenizer
    train_docs, val_docs, corpus_stats = load_corpus(args.data_dir, args)
    log(f"corpus: {len(train_docs)} train docs, {len(val_docs)} val docs; {json.dumps(corpus_stats)}")
    tok_path = args.tokenizer or os.path.join(args.work_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        tok = Tokenizer.from_file(tok_path)
        log(f"tokenizer loaded from {tok_path}")
    else:
        t = time.time()
        tok = build_tokenizer(train_docs, args.vocab_size)
        tok.save(tok_path + ".tmp")
        os.replace(tok_path + ".tmp", tok_path)
        log(f"tokenizer trained in {time.time() - t:.1f}s")
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    log(f"vocab {vocab}, bos {bos}, eos {eos}; sample: "
        f"{tok.encode('The place is: Poubreth Crossing.').tokens}")

    t = time.time()
    train_seqs = tokenize_docs(tok, train_docs, bos, eos)
    val_seqs = tokenize_docs(tok, val_docs, bos, eos)
    rng = np.random.default_rng([args.seed, 7])
    order = rng.permutation(len(train_seqs))
    stream = np.fromiter((t_ for i in order for t_ in train_seqs[i]), dtype=np.int64)
    vstream = np.fromiter((t_ for s in val_seqs for t_ in s), dtype=np.int64)
    L = args.seq_len
    n_chunks = len(stream) // L
    chunks = torch.from_numpy(stream[:n_chunks * L].reshape(n_chunks, L)).to(device)
    vchunks = torch.from_numpy(vstream[:(len(vstream) // L) * L].reshape(-1, L)).to(device)
    log(f"corpus tokens: train {len(stream)} ({n_chunks} seqs of {L}), val {len(vstream)} "
        f"({vchunks.shape[0]} seqs); chars/token {sum(map(len, train_docs)) / len(stream):.2f}")

    coref_train, coref_val, bad_total, too_long = [], {}, 0, 0
    if args.coref_select:
        # Selection samples come from pools of their own (tools/make_training_pools.py --split
        # select: names and lead parts never in training), so no training file is cut.
        for path in args.coref_train:
            tr_tok, b = tokenize_coref(tok, load_coref(path), eos)
            bad_total += b
            kept = [x for x in tr_tok if len(x[0]) <= args.seq_len]
            too_long += len(tr_tok) - len(kept)
            coref_train += kept
            log(f"coref train {path}: {len(kept)} samples ({len(tr_tok) - len(kept)} longer than "
                f"{args.seq_len} tokens dropped), answer-decode mismatches {b}")
        for spec in args.coref_select:
            kind, path = spec.split("=", 1)
            coref_val[kind], b = tokenize_coref(tok, load_coref(path), eos)
            bad_total += b
            log(f"coref select {kind} {path}: {len(coref_val[kind])} samples, mismatches {b}")
    else:
        coref_files = {"normal": os.path.join(args.data_dir, "coref-train.jsonl"),
                       "hard": os.path.join(args.data_dir, "coref-train-hard.jsonl")}
        for kind, path in coref_files.items():
            texts = load_coref(path)
            tr, va = texts[:-args.coref_val], texts[-args.coref_val:]
            tr_tok, b1 = tokenize_coref(tok, tr, eos)
            va_tok, b2 = tokenize_coref(tok, va, eos)
            bad_total += b1 + b2
            coref_train += tr_tok
            coref_val[kind] = va_tok
            log(f"coref {kind}: {len(tr)} train, {len(va)} val, answer-decode mismatches {b1 + b2}")
    CL = max(len(s) for s, _ in coref_train)
    CL = (CL + 7) // 8 * 8
    cx = torch.full((len(coref_train), CL), eos, dtype=torch.long)
    cw = torch.zeros((len(coref_train), CL), dtype=torch.float32)
    clen = torch.tensor([len(s) for s, _ in coref_train], dtype=torch.long)
    for j, (s, am) in enumerate(coref_train):
        cx[j, :len(s)] = torch.tensor(s)
        w = torch.ones(len(s))
        w[torch.tensor(am, dtype=torch.bool)] = args.answer_weight
        cw[j, :len(s)] = w
    cx, cw, clen = cx.to(device), cw.to(device), clen.to(device)
    log(f"coref train seqs: {len(coref_train)}, padded length {CL}; tokenizing took "
        f"{time.time() - t:.1f}s")

    b_coref = max(1, round(args.batch * args.coref_frac))
    b_corpus = args.batch - b_coref
    sched_corpus = torch.from_numpy(schedule(n_chunks, b_corpus, args.steps, args.seed + 1)).to(device)
    sched_coref = torch.from_numpy(schedule(len(coref_train), b_coref, args.steps, args.seed + 2)).to(device)
    log(f"per step: {b_corpus} corpus seqs + {b_coref} coref seqs; corpus epochs over the run: "
        f"{args.steps * b_corpus / n_chunks:.1f}, coref epochs: {args.steps * b_coref / len(coref_train):.1f}")

    # Copy sequences: [bos, r_1..r_n, r_1..r_n] with r drawn uniformly from the non-special
    # vocabulary; only r_2..r_n of the repeat are scored (r_1 cannot be known in advance).
    copy_gen = torch.Generator(device=device)
    copy_gen.manual_seed(args.seed + 3)
    n_special = max(bos, eos) + 1
    if args.copy_batch:
        lo, hi = args.copy_len
        if not 2 <= lo <= hi or 2 * hi + 1 > args.seq_len:
            ap.error(f"--copy-len {lo} {hi}: expected 2 <= MIN <= MAX and 2 * MAX + 1 <= --seq-len")
        log(f"copy sequences: {args.copy_batch} per step, first half {lo}..{hi} tokens")

    def copy_batch():
        n = int(torch.randint(args.copy_len[0], args.copy_len[1] + 1, (1,), generator=copy_gen,
                              device=device))
        r = torch.randint(n_special, vocab, (args.copy_batch, n), generator=copy_gen, device=device)
        seq = torch.cat([torch.full((args.copy_batch, 1), bos, device=device), r, r], dim=1)
        return seq, n

    # Context-copy sequences: <s> prose_a + intro + name + "." + prose_b + question + name, the
    # prose cut from the training stream at random places, the name 1 space-led + 0..4 inner
    # vocabulary pieces; only the final name is scored (answer weight), its first token included,
    # since finding which name to give is the retrieval this task trains.
    ctx_rng = np.random.default_rng([args.seed, 11])
    ctx_intros = [tok.encode(t, add_special_tokens=False).ids
                  for t in (" The place is:", " It is called:", " The name of it is:")]
    ctx_questions = [tok.encode(t, add_special_tokens=False).ids
                     for t in (" What is the place called?:", " Which place was it?:",
                               " What was its name?:")]
    ctx_period = tok.encode(".", add_special_tokens=False).ids
    pieces = tok.get_vocab()
    space_led = np.array(sorted(i for t, i in pieces.items() if t.startswith("\u0120") and len(t) > 2
                                and t[1:].isalpha()))
    inner = np.array(sorted(i for t, i in pieces.items() if t.isalpha() and t.islower()))

    def context_copy_batch():
        rows, weights = [], []
        for _ in range(args.context_copy_batch):
            name = [int(ctx_rng.choice(space_led))] + [int(x) for x in ctx_rng.choice(
                inner, size=int(ctx_rng.integers(0, 5)))]
            a, b = int(ctx_rng.integers(16, 300)), int(ctx_rng.integers(32, 400))
            ia, ib = (int(x) for x in ctx_rng.integers(0, len(stream) - 400, size=2))
            q = ctx_questions[int(ctx_rng.integers(len(ctx_questions)))]
            head = ([bos] + stream[ia:ia + a].tolist() + ctx_intros[int(ctx_rng.integers(len(ctx_intros)))]
                    + name + ctx_period + stream[ib:ib + b].tolist() + q)
            rows.append(head + name)
            weights.append([0.0] * len(head) + [args.answer_weight] * len(name))
        width = max(map(len, rows))
        seq = torch.full((len(rows), width), eos, dtype=torch.long)
        w = torch.zeros((len(rows), width))
        for j, (r, wr) in enumerate(zip(rows, weights)):
            seq[j, :len(r)] = torch.tensor(r)
            w[j, :len(wr)] = torch.tensor(wr)
        return seq.to(device), w.to(device)

    if args.context_copy_batch:
        log(f"context-copy sequences: {args.context_copy_batch} per step; names from "
            f"{len(space_led)} space-led and {len(inner)} inner pieces")
        example, _ = context_copy_batch()
        text = tok.decode(example[0].tolist(), skip_special_tokens=True)
        log(f"context-copy example: {text[:160]!r} ... {text[-160:]!r}")

    # ---- model
    config = make_config(vocab, bos, eos, args)
    model = LlamaForCausalLM(config).to(device)
    if args.init_from:
        start = LlamaForCausalLM.from_pretrained(args.init_from, torch_dtype=torch.float32)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(start.config, key) != getattr(config, key):
                ap.error(f"--init-from {args.init_from}: config.json {key} is "
                         f"{getattr(start.config, key)}, expected {getattr(config, key)}")
        model.load_state_dict(start.state_dict())
        log(f"weights from {args.init_from}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model params {n_params} ({n_params * 2 / 1e6:.1f} MB in bf16)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=on_gpu)

    history = {"train": [], "evals": []}
    # The checkpoint kept for saving: small corpora overfit, so the last step is not the best one.
    best = {"step": -1, "corpus_val_loss": float("inf"), "state": None}
    step0, train_seconds = 0, 0.0
    ckpt_path = os.path.join(args.work_dir, "ckpt.pt")
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step0, history, train_seconds = ck["step"], ck["history"], ck["train_seconds"]
        best = ck.get("best", best)
        torch.set_rng_state(ck["rng_cpu"].cpu())
        if on_gpu:
            torch.cuda.set_rng_state(ck["rng_cuda"].cpu())
        log(f"resumed from {ckpt_path} at step {step0}")

    def save_ckpt(step):
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "history": history, "train_seconds": train_seconds, "args": vars(args),
                    "best": best,
                    "rng_cpu": torch.get_rng_state(),
                    "rng_cuda": torch.cuda.get_rng_state() if on_gpu else None}, tmp)
        os.replace(tmp, ckpt_path)

    def evaluate(step, full):
        t = time.time()
        vc = vchunks if full else vchunks[:64]
        r = {"step": step, "corpus_val_loss": eval_corpus(model, vc)}
        for kind, samples in coref_val.items():
            r["coref_" + kind] = eval_coref(model, samples, eos, device)
        r["eval_seconds"] = round(time.time() - t, 2)
        history["evals"].append(r)
        if (r["coref_normal"]["accuracy"] >= args.select_min_coref_acc
                and r["corpus_val_loss"] < best["corpus_val_loss"]):
            best.update(step=step, corpus_val_loss=r["corpus_val_loss"],
                        state={k: v.detach().to("cpu", copy=True)
                               for k, v in model.state_dict().items()})
            log(f"best checkpoint so far: step {step}")
        extra = "".join(f"; {kind} acc {r['coref_' + kind]['accuracy']:.3f}" for kind in coref_val
                        if kind not in ("normal", "hard"))
        log(f"EVAL step {step}: corpus val loss {r['corpus_val_loss']:.4f}; coref normal acc "
            f"{r['coref_normal']['accuracy']:.3f} cov {r['coref_normal']['coverage']:.3f}; hard acc "
            f"{r['coref_hard']['accuracy']:.3f} cov {r['coref_hard']['coverage']:.3f}{extra}")
        return r

    # ---- train
    model.train()
    V = vocab
    t_run = time.time()
    acc_c, acc_q, acc_n = 0.0, 0.0, 0
    step = step0
    stopped_early = False
    if on_gpu:
        torch.cuda.synchronize()
    t_log = time.time()
    while step < args.steps:
        if args.max_train_seconds and train_seconds + (time.time() - t_run) > args.max_train_seconds:
            log(f"stopping early at step {step}: --max-train-seconds reached")
            stopped_early = True
            break
        lr = lr_at(step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        x = chunks[sched_corpus[step]]
        qi = sched_coref[step]
        # Trimmed to the batch's longest sample: lengths vary from ~100 to 1024 tokens.
        q_len = int(clen[qi].max())
        q, qw = cx[qi, :q_len], cw[qi, :q_len]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            lc = model(input_ids=x).logits[:, :-1]
            lq = model(input_ids=q).logits[:, :-1]
        ce_c = F.cross_entropy(lc.float().reshape(-1, V), x[:, 1:].reshape(-1), reduction="sum")
        wq = qw[:, 1:]
        ce_q_tok = F.cross_entropy(lq.float().reshape(-1, V), q[:, 1:].reshape(-1),
                                   reduction="none").view(wq.shape)
        ce_q = (ce_q_tok * wq).sum()
        n_c = x[:, 1:].numel()
        if args.copy_batch:
            seq, n = copy_batch()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                lk = model(input_ids=seq).logits[:, n + 1:-1]  # predicts seq[:, n + 2:]
            ce_k = F.cross_entropy(lk.float().reshape(-1, V), seq[:, n + 2:].reshape(-1),
                                   reduction="sum")
            ce_q = ce_q + ce_k
            n_c += seq[:, n + 2:].numel()
            copy_loss = ce_k.detach() / seq[:, n + 2:].numel()
        if args.context_copy_batch:
            cseq, cw_ = context_copy_batch()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                lx = model(input_ids=cseq).logits[:, :-1]
            ce_x_tok = F.cross_entropy(lx.float().reshape(-1, V), cseq[:, 1:].reshape(-1),
                                       reduction="none").view(cw_[:, 1:].shape)
            ce_q = ce_q + (ce_x_tok * cw_[:, 1:]).sum()
            n_c += cw_[:, 1:].sum()
            ctx_loss = ((ce_x_tok * (cw_[:, 1:] > 0)).sum() / (cw_[:, 1:] > 0).sum()).detach()
        loss = (ce_c + ce_q) / (n_c + wq.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == args.steps:
            cval = (ce_c / n_c).item()
            qval = ((ce_q_tok * (wq > 0)).sum() / (wq > 0).sum()).item()
            now = time.time()
            rate = args.log_every / (now - t_log)
            t_log = now
            history["train"].append({"step": step, "lr": lr, "corpus_loss": cval, "coref_loss": qval})
            copy_note = f" copy loss {copy_loss.item():.4f}" if args.copy_batch else ""
            if args.context_copy_batch:
                copy_note += f" context-copy loss {ctx_loss.item():.4f}"
            log(f"step {step}/{args.steps} lr {lr:.2e} corpus loss {cval:.4f} coref loss {qval:.4f}"
                f"{copy_note} ({rate:.1f} steps/s)")
        if step % args.eval_every == 0 and step < args.steps:
            evaluate(step, full=True)
            t_log = time.time()
        if step % args.ckpt_every == 0 and step < args.steps:
            train_seconds += time.time() - t_run
            t_run = time.time()
            save_ckpt(step)
            t_log = time.time()
    if on_gpu:
        torch.cuda.synchronize()
    train_seconds += time.time() - t_run
    save_ckpt(step)
    log(f"training done at step {step}; train seconds {train_seconds:.1f}")

    last = evaluate(step, full=True)
    final = last
    if best["state"] is not None and best["step"] != step:
        model.load_state_dict(best["state"])
        final = evaluate(best["step"], full=True)
        history["evals"].pop()  # the re-evaluation duplicates the entry made at that step
    log(f"selected checkpoint: step {final['step']} (last step {step})")
    if args.heldback_out:
        with open(args.heldback_out, "w", encoding="utf-8") as f:
            f.write("\n\n".join(val_docs) + "\n")
        log(f"held-back corpus text written to {args.heldback_out}")

    # ---- save
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos,
                                               pad_token_id=eos, do_sample=False)
    model.config.attention_dropout = 0.0  # a training regulariser only: inference has none
    model.save_pretrained(args.out)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    train_log = {
        "args": vars(args), "steps_done": step, "stopped_early": stopped_early,
        "corpus_stats": corpus_stats,
        "tokens": {"corpus_train": int(len(stream)), "corpus_val": int(len(vstream)),
                   "corpus_train_seqs": int(n_chunks), "corpus_val_seqs": int(vchunks.shape[0]),
                   "coref_train_samples": len(coref_train), "coref_padded_len": CL,
                   "coref_answer_decode_mismatches": bad_total,
                   "coref_dropped_too_long": too_long},
        "batch": {"corpus": b_corpus, "coref": b_coref},
        "params": n_params, "vocab_size": vocab,
        "selected_step": final["step"], "final": final, "last": last, "history": history,
        "timing": {"train_seconds": round(train_seconds, 1),
                   "total_seconds": round(time.time() - T0, 1)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "cuda": torch.version.cuda,
                     "gpu": torch.cuda.get_device_name(0) if on_gpu else platform.processor()},
    }
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(train_log, f, indent=1)
    files = {n: os.path.getsize(os.path.join(args.out, n)) for n in sorted(os.listdir(args.out))}
    log(f"saved to {args.out}: {files}")
    log(f"FINAL corpus val loss {final['corpus_val_loss']:.4f}; coref normal acc "
        f"{final['coref_normal']['accuracy']:.3f} cov {final['coref_normal']['coverage']:.3f}; "
        f"hard acc {final['coref_hard']['accuracy']:.3f} cov {final['coref_hard']['coverage']:.3f}")


if __name__ == "__main__":
    main()
