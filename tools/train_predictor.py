#!/usr/bin/env python3
"""Trains a TokenButler predictor (tools/tokenbutler.py; POLICIES.md "The TokenButler predictor")
for a kvlens model folder: a Llama-family model (config.json + safetensors + tokenizer.json) run by
transformers in F32, frozen, eval mode. Writes predictor.safetensors + predictor.json (the format of
engine/model/predictor.h), train_log.json and curves.png into --out.

Recipe (the reference training code's, as defaults)
  * Data: --data files, .txt (blank-line-separated blocks grouped into documents of at most
    --doc-chars characters, so a book's paragraphs stay together) or .jsonl (one document per line,
    field "text"). Tokenized with the model folder's tokenizer.json (`tokenizers` library, no
    special tokens), each document as BOS ids EOS (the ids of config.json; a missing one is left
    out), documents shuffled (seeded) and packed into sequences of --seq-len tokens (default
    min(1024, max_position_embeddings); attention plain causal across document boundaries).
  * Held out: the last --heldout-frac (2%) of every file's characters, cut at a document boundary,
    is never trained on; --eval-sequences sequences of it (evenly spaced) are scored.
  * Loss: for layers 1..N-1, the MSE between the predicted logits q_imp.k_imp/sqrt(d') and the
    true q.k/sqrt(head_dim) (after RoPE and GQA expansion, before mask and softmax) over the full
    L x L square, averaged over heads, then layers. AdamW (lr 1e-3, PyTorch's other defaults),
    cosine schedule with 10% linear warm-up, gradient-norm clip 20, batch 1, dropout 0.1 in the
    predictor's FFN while training; one epoch over the training sequences unless --steps/--tokens.
  * Selection: every --eval-every steps (and at the end) the held-out MSE and top-50% hit rate
    are measured: per (layer, head, query row i >= --min-row) the fraction of the candidates 0..i
    whose membership in the predicted top ceil((i+1)/2) agrees with the true top ceil((i+1)/2)
    (ties count the more recent token first), per layer and averaged over layers 1..N-1. The
    checkpoint with the best held-out hit rate is written. The reference code keeps the one with
    the best WikiText-2 perplexity under the sparse policy; that needs the sparse-attention model
    in the loop and mixes the predictor's quality with the policy's knobs, while the hit rate
    measures what the predictor is for (ranking the keys each head attends to) and is what the
    paper reports for predictors. Perplexity under the policy is measured by kvlens afterwards.
  * Determinism: everything comes from --seed. On the CPU two runs give identical files; on a GPU
    deterministic algorithms are requested (CUBLAS_WORKSPACE_CONFIG, cuDNN deterministic).

On the GPU machine (no ../shared there: copy the text into a folder of the repository first, e.g.
`mkdir -p .carry && cp ../shared/data/corpus/*.{txt,jsonl} .carry/`):
    python3 tools/train_predictor.py --model assets/models/demo --data .carry/*.txt .carry/*.jsonl \\
        --out $OUT/demo-predictor --device cuda
Smoke test (CPU, a minute):
    python3 tools/train_predictor.py --model assets/models/demo \\
        --data ../shared/data/corpus/tinyshakespeare.txt --out /tmp/tb-smoke --seq-len 128 \\
        --steps 20 --eval-every 10 --eval-sequences 2 --intdim 64
Held-out hit rate of an existing predictor (for a model card):
    python3 tools/train_predictor.py --report-only --predictor DIR --model M --data FILES...
"""

import argparse
import copy
import json
import math
import os
import platform
import random
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402
from corpus_text import heldout_split, read_documents  # noqa: E402

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data

def first_id(value):
    if isinstance(value, list):
        return value[0] if value else None
    return value


def answer_spans(path):
    """A .jsonl file's answer spans, aligned with read_documents' documents: (begin, end) as
    character indices of the stripped text where a record has answer_char_begin/answer_char_end
    (UTF-8 byte offsets, as kvlens-cli coref-samples writes them), else None. Other files: None
    for every document."""
    if not path.endswith(".jsonl"):
        return None
    spans = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            text = obj.get("text") if isinstance(obj, dict) else None
            if not isinstance(text, str) or not text.strip():
                continue
            begin, end = obj.get("answer_char_begin"), obj.get("answer_char_end")
            if begin is None or end is None:
                spans.append(None)
                continue
            raw = text.encode("utf-8")
            if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin < end <= len(raw)):
                raise SystemExit(f"{path}:{number}: answer_char_begin/answer_char_end must be "
                                 f"UTF-8 byte offsets 0 <= begin < end <= {len(raw)}, found "
                                 f"{begin}, {end}")
            try:
                begin, end = len(raw[:begin].decode("utf-8")), len(raw[:end].decode("utf-8"))
            except UnicodeDecodeError:
                raise SystemExit(f"{path}:{number}: answer_char_begin/answer_char_end must fall "
                                 f"on character boundaries, found {obj['answer_char_begin']}, "
                                 f"{obj['answer_char_end']}") from None
            shift = len(text) - len(text.lstrip())
            spans.append((begin - shift, end - shift))
    return spans


def encode(tokenizer, docs, bos, eos, spans=None):
    """-> (token lists, answer-row lists): row i of a document is flagged when token i + 1 is an
    answer token (the query row whose attention decides that token when it is decoded)."""
    out, rows = [], []
    lead = 1 if bos is not None else 0
    for start in range(0, len(docs), 512):
        batch = tokenizer.encode_batch(docs[start:start + 512], add_special_tokens=False)
        for offset, enc in enumerate(batch):
            ids = ([bos] if bos is not None else []) + enc.ids + ([eos] if eos is not None else [])
            flags = [False] * len(ids)
            span = spans[start + offset] if spans else None
            if span is not None:
                for j, (a, b) in enumerate(enc.offsets):
                    if a < span[1] and b > span[0] and j + lead >= 1:
                        flags[j + lead - 1] = True
            out.append(ids)
            rows.append(flags)
    return out, rows


def pack(token_lists, seq_len, dtype=torch.long):
    stream = [t for ids in token_lists for t in ids]
    n = len(stream) // seq_len
    if n == 0:
        return torch.zeros((0, seq_len), dtype=dtype)
    return torch.tensor(stream[:n * seq_len], dtype=dtype).view(n, seq_len)


def prepare_data(args, model_dir, config):
    """-> (train sequences [S, L], their answer rows [S, L] bool, held-out sequences [V, L],
    per-file statistics); with --whole-documents the training side is a list of one tensor per
    document ([<= L] each) instead."""
    from tokenizers import Tokenizer
    tok_path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise SystemExit(f"{tok_path}: missing (the model folder's tokenizer)")
    tokenizer = Tokenizer.from_file(tok_path)
    bos, eos = first_id(config.get("bos_token_id")), first_id(config.get("eos_token_id"))
    train_docs, held_docs, stats = [], [], []
    for path in args.data:
        docs = read_documents(path, args.doc_chars)
        train, held = heldout_split(docs, args.heldout_frac)
        train_ids, train_rows = encode(tokenizer, train, bos, eos, answer_spans(path))
        held_ids, _ = encode(tokenizer, held, bos, eos)
        train_docs += zip(train_ids, train_rows)
        held_docs += held_ids
        stats.append({"path": os.path.abspath(path), "documents": len(docs),
                      "train_documents": len(train), "heldout_documents": len(held),
                      "train_tokens": sum(map(len, train_ids)),
                      "heldout_tokens": sum(map(len, held_ids)),
                      "answer_rows": sum(map(sum, train_rows))})
        log(f"{path}: {len(docs)} documents, {stats[-1]['train_tokens']} training tokens, "
            f"{stats[-1]['heldout_tokens']} held out, {stats[-1]['answer_rows']} answer rows")
    random.Random(args.seed).shuffle(train_docs)
    if getattr(args, "whole_documents", False):  # one document per sequence, cut at --seq-len
        return ([torch.tensor(ids[:args.seq_len], dtype=torch.long) for ids, _ in train_docs],
                [torch.tensor(rows[:args.seq_len], dtype=torch.bool) for _, rows in train_docs],
                pack(held_docs, args.seq_len), stats)
    return (pack([ids for ids, _ in train_docs], args.seq_len),
            pack([rows for _, rows in train_docs], args.seq_len, torch.bool),
            pack(held_docs, args.seq_len), stats)


def pick_eval(held, count):
    if held.shape[0] == 0:
        raise SystemExit("the held-out text is shorter than one sequence: add data, raise "
                         "--heldout-frac or lower --seq-len")
    if held.shape[0] <= count:
        return held
    idx = [round(i * (held.shape[0] - 1) / max(1, count - 1)) for i in range(count)]
    return held[idx]


# ----------------------------------------------------------------------------- training

def cosine_with_warmup(warmup, total):
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return factor


def step_loss(model, predictor, ids, answer_rows=None, answer_weight=0.0):
    """Mean over layers 1..N-1 of the per-head MSE between predicted and true logits; with
    answer_weight > 0, plus answer_weight x the MSE over the answer rows' causal entries
    (answer_rows [B, L] bool; see --answer-weight)."""
    hidden = tb.layer_hidden_states(model, ids)
    q, k = predictor(tb.layer0_input(model, hidden))
    weights = None
    if answer_weight > 0 and answer_rows is not None and bool(answer_rows.any()):
        L = ids.shape[1]
        causal = torch.ones(L, L, dtype=torch.bool, device=ids.device).tril()
        weights = (answer_rows[:, None, :, None] & causal).float()  # [B, 1, L, L]
        entries = weights.sum() * predictor.heads
    total = 0.0
    for layer in range(1, predictor.layers):
        true = tb.true_layer_logits(model, hidden, layer)
        pred = tb.predicted_logits(q[:, layer], k[:, layer])
        squared = (pred - true) ** 2
        total = total + squared.mean(dim=(-1, -2)).mean(dim=-1).mean()
        if weights is not None:
            total = total + answer_weight * (squared * weights).sum() / entries
    return total / (predictor.layers - 1)


@torch.no_grad()
def evaluate(model, predictor, sequences, device, min_row):
    """Held-out MSE and top-50% hit rate, per layer 1..N-1 and their means."""
    was_training = predictor.training
    predictor.eval()
    layers = list(range(1, predictor.layers))
    mse = torch.zeros(len(layers), dtype=torch.float64)
    hit = torch.zeros(len(layers), dtype=torch.float64)
    for seq in sequences:
        ids = seq[None].to(device)
        hidden = tb.layer_hidden_states(model, ids)
        q, k = predictor(tb.layer0_input(model, hidden))
        for i, layer in enumerate(layers):
            true = tb.true_layer_logits(model, hidden, layer)[0]
            pred = tb.predicted_logits(q[0, layer], k[0, layer])
            mse[i] += ((pred - true) ** 2).mean().double().cpu()
            hit[i] += tb.top_half_agreement(pred, true, min_row).mean().cpu()
    predictor.train(was_training)
    mse, hit = mse / len(sequences), hit / len(sequences)
    return {"mse": mse.mean().item(), "hit_rate": hit.mean().item(), "layers": layers,
            "mse_per_layer": mse.tolist(), "hit_rate_per_layer": hit.tolist()}


def set_determinism(seed, device):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "tokenizers", "safetensors", "numpy"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - provenance only
            out[name] = None
    return out


def plot_curves(path, train_log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("warning: matplotlib is not installed, curves.png skipped")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps, losses = zip(*train_log["train_loss"]) if train_log["train_loss"] else ((), ())
    axes[0].plot(steps, losses, lw=0.8)
    axes[0].set(title="training loss (MSE of logits)", xlabel="step", yscale="log")
    evals = train_log["evals"]
    axes[1].plot([e["step"] for e in evals], [e["hit_rate"] for e in evals], marker="o")
    axes[1].set(title="held-out top-50% hit rate", xlabel="step", ylabel="hit rate")
    best = max(evals, key=lambda e: e["hit_rate"])
    axes[2].bar([str(l) for l in best["layers"]], best["hit_rate_per_layer"])
    axes[2].set(title=f"held-out hit rate per layer (step {best['step']})", xlabel="layer",
                ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(args, model, config, device, train_seqs, train_rows, eval_seqs, data_stats):
    if len(train_seqs) == 0:
        raise SystemExit("the training text is shorter than one sequence")
    if config["num_hidden_layers"] < 2:
        raise SystemExit("the model has one layer: there is nothing to predict (layer 0 is dense)")
    per_step = args.batch * args.seq_len
    if args.steps:
        steps = args.steps
    elif args.tokens:
        steps = max(1, math.ceil(args.tokens / per_step))
    else:
        steps = max(1, len(train_seqs) // args.batch)
    if steps * args.batch > len(train_seqs):
        log(f"warning: {steps} steps need {steps * args.batch} sequences, the data has "
            f"{len(train_seqs)}: they are reused")
    torch.manual_seed(args.seed)
    if args.init_from:
        predictor = start_from(args, config).to(device).train()
    else:
        predictor = tb.TokenButlerPredictor(
            hidden_size=config["hidden_size"], heads=config["num_attention_heads"],
            layers=config["num_hidden_layers"], attn_reduce_factor=args.attn_reduce_factor,
            dDash=args.dDash, intdim=args.intdim, variant=args.variant,
            rope_theta=tb.config_rope_theta(config), dropout=args.dropout).to(device).train()
    count = sum(p.numel() for p in predictor.parameters())
    log(f"predictor {args.variant}: {count:,} parameters; {steps} steps of {per_step} tokens")
    optimizer = torch.optim.AdamW(predictor.parameters(), lr=args.lr)
    warmup = int(args.warmup_frac * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(warmup, steps))

    from tqdm import tqdm
    train_log = {"args": vars(args), "train_loss": [], "evals": []}
    best, best_state = None, None

    def run_eval(step):
        nonlocal best, best_state
        result = evaluate(model, predictor, eval_seqs, device, args.min_row)
        result.update(step=step, lr=scheduler.get_last_lr()[0])
        train_log["evals"].append(result)
        if best is None or result["hit_rate"] > best["hit_rate"] or args.select == "last":
            best = result
            best_state = {k: v.detach().cpu().clone() for k, v in predictor.state_dict().items()}
        return result

    last_hit = run_eval(0)["hit_rate"]
    bar = tqdm(total=steps, file=sys.stderr, dynamic_ncols=True, disable=args.no_progress)
    for step in range(1, steps + 1):
        index = [((step - 1) * args.batch + b) % len(train_seqs) for b in range(args.batch)]
        if args.whole_documents:
            ids, rows = train_seqs[index[0]][None], train_rows[index[0]][None]
        else:
            ids, rows = train_seqs[index], train_rows[index]
        loss = step_loss(model, predictor, ids.to(device), rows.to(device), args.answer_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(predictor.parameters(), args.grad_clip)
        optimizer.step()
        scheduler.step()
        value = loss.item()
        if not math.isfinite(value):
            raise SystemExit(f"step {step}: the loss is {value}")
        train_log["train_loss"].append([step, value])
        if step % args.eval_every == 0 or step == steps:
            last_hit = run_eval(step)["hit_rate"]
        bar.set_postfix(loss=f"{value:.4g}", heldout_hit=f"{last_hit:.4f}")
        bar.update(1)
    bar.close()
    predictor.load_state_dict(best_state)
    return predictor, train_log, best, steps


def start_from(args, config):
    """--init-from: an existing predictor of this model, trained on (its sizes win over the size
    options; its dropout is --dropout)."""
    predictor = tb.load_predictor(args.init_from)
    for key, want in (("hidden_size", config["hidden_size"]),
                      ("heads", config["num_attention_heads"]),
                      ("layers", config["num_hidden_layers"])):
        if getattr(predictor, key) != want:
            raise SystemExit(f"--init-from {args.init_from}: predictor.json {key} is "
                             f"{getattr(predictor, key)}, the model's is {want}")
    for module in predictor.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = args.dropout
    args.dDash, args.intdim = predictor.dDash, predictor.intdim
    args.attn_reduce_factor, args.variant = predictor.attn_reduce_factor, predictor.variant
    return predictor


def setup(args):
    """The device (seeded), the model's config, the training and held-out sequences, the scored
    held-out sequences and the data statistics, shared by training and --report-only."""
    device = torch.device(args.device)
    set_determinism(args.seed, device)
    config = tb.read_config(args.model)
    if args.seq_len is None:
        args.seq_len = min(1024, config.get("max_position_embeddings") or 1024)
    train_seqs, train_rows, held_seqs, stats = prepare_data(args, args.model, config)
    return (device, config, (train_seqs, train_rows), held_seqs,
            pick_eval(held_seqs, args.eval_sequences), stats)


def run_training(args):
    device, config, (train_seqs, train_rows), held_seqs, eval_seqs, stats = setup(args)
    log(f"{len(train_seqs)} training sequences, {held_seqs.shape[0]} held out "
        f"({eval_seqs.shape[0]} scored) of {args.seq_len} tokens")
    model = tb.load_base_model(args.model, device)
    predictor, train_log, best, steps = train(args, model, config, device, train_seqs,
                                              train_rows, eval_seqs, stats)
    elapsed = time.time() - T0
    training = {
        "tool": "tools/train_predictor.py", "command": sys.argv[1:], "data": stats,
        "seq_len": args.seq_len, "batch": args.batch, "steps": steps,
        "tokens_seen": (None if args.whole_documents else steps * args.batch * args.seq_len),
        "whole_documents": args.whole_documents, "init_from": args.init_from or None,
        "seed": args.seed,
        "device": str(device),
        "recipe": {"loss": "MSE of predicted vs true pre-softmax logits, full LxL square, "
                           "mean over heads then layers 1..N-1",
                   "answer_weight": args.answer_weight,
                   "optimizer": "AdamW", "lr": args.lr, "weight_decay": 0.01,
                   "schedule": "cosine", "warmup_steps": int(args.warmup_frac * steps),
                   "grad_clip": args.grad_clip, "dropout": args.dropout,
                   "selection": ("the last step" if args.select == "last"
                                 else "best held-out top-50% hit rate")},
        "best_step": best["step"],
        "heldout": {"sequences": int(eval_seqs.shape[0]), "min_row": args.min_row,
                    "hit_rate": best["hit_rate"], "mse": best["mse"],
                    "hit_rate_per_layer": dict(zip(map(str, best["layers"]),
                                                   best["hit_rate_per_layer"])),
                    "mse_per_layer": dict(zip(map(str, best["layers"]), best["mse_per_layer"]))},
        "final_train_loss": train_log["train_loss"][-1][1],
        "seconds": round(elapsed, 1), "versions": versions()}
    info = tb.save_predictor(predictor, args.out, tb.base_model_info(args.model, config), training)
    train_log["best_step"] = best["step"]
    train_log["seconds"] = round(elapsed, 1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(train_log, f, indent=1)
    plot_curves(os.path.join(args.out, "curves.png"), train_log)
    log(f"best step {best['step']}: held-out hit rate {best['hit_rate']:.4f}, "
        f"MSE {best['mse']:.4g}; {info['parameters']:,} parameters written to {args.out}")


def report(args):
    """Held-out hit rate and MSE of an existing predictor, per layer, as JSON on stdout."""
    device, config, _, held_seqs, eval_seqs, stats = setup(args)
    model = tb.load_base_model(args.model, device)
    predictor = tb.load_predictor(args.predictor).to(device)
    result = evaluate(model, predictor, eval_seqs, device, args.min_row)
    result.update(predictor=os.path.abspath(args.predictor), sequences=int(eval_seqs.shape[0]),
                  seq_len=args.seq_len, min_row=args.min_row, data=stats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "heldout_report.json"), "w") as f:
            f.write(text + "\n")
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (config.json, safetensors, "
                   "tokenizer.json)")
    p.add_argument("--data", nargs="+", required=True, help=".txt or .jsonl files")
    p.add_argument("--out", help="output folder")
    p.add_argument("--variant", choices=tb.VARIANTS, default="hf")
    p.add_argument("--dDash", type=int, default=16)
    p.add_argument("--intdim", type=int, default=512)
    p.add_argument("--attn-reduce-factor", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--init-from", default="",
                   help="predictor folder to continue training (a second stage)")
    p.add_argument("--whole-documents", action="store_true",
                   help="one document per training sequence (cut at --seq-len) instead of packing; "
                        "batch 1")
    p.add_argument("--select", choices=["hit_rate", "last"], default="hit_rate",
                   help="the checkpoint written: best held-out hit rate (evaluated every "
                        "--eval-every steps), or the last step (a second stage whose aim the "
                        "held-out text does not measure)")
    p.add_argument("--answer-weight", type=float, default=0.0,
                   help="add this x the MSE over the answer rows of co-reference samples (.jsonl "
                        "records with answer_char_begin/end); 0 = the reference recipe")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--doc-chars", type=int, default=8000, help=".txt documents' size limit")
    p.add_argument("--heldout-frac", type=float, default=0.02)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="default: one epoch")
    p.add_argument("--tokens", type=int, default=0, help="token budget instead of --steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-frac", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-sequences", type=int, default=16)
    p.add_argument("--min-row", type=int, default=8)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--report-only", action="store_true",
                   help="score --predictor on the held-out text instead of training")
    p.add_argument("--predictor", help="predictor folder for --report-only")
    args = p.parse_args(argv)
    if args.report_only and not args.predictor:
        p.error("--report-only needs --predictor")
    if not args.report_only and not args.out:
        p.error("--out is required")
    if args.eval_every < 1:
        p.error("--eval-every must be >= 1")
    if args.whole_documents and args.batch != 1:
        p.error("--whole-documents trains one document a step: --batch must be 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        report(args)
    else:
        run_training(args)


if __name__ == "__main__":
    main()
