#!/usr/bin/env python3
"""Calibration files of the approximate-logit policies loki and doublesparsity
(engine/policy/channel_calibration.h, docs/policies/loki.md and doublesparsity.md), from one pass of
a Hugging Face checkpoint over corpus text. Writes beside the model (or into --out):

  loki_pca.safetensors             basis F32 [L, G, D, D]: per layer and KV head, the principal
                                   directions of the post-RoPE keys (the centred covariance's
                                   eigenvectors, as sklearn's PCA), direction i in column i by
                                   explained variance; explained_variance_ratio F32 [L, G, D]
  doublesparsity_channels.safetensors
                                   channels F32 [L, H, D]: per layer and query head, the channel
                                   numbers by mean |q_c k_c| over the tokens (post-RoPE, each
                                   query head against its KV head's key), most important first
                                   (ties to the lower channel); importance F32 [L, H, D]

Text: the training part of each corpus file (corpus_text.heldout_split's, so the held-back text the
results are measured on is never calibrated on), documents in file order, tokenized with the
model's tokenizer.json (or AutoTokenizer), joined and cut into --block-token blocks; the first
--tokens tokens. Statistics in float64; on the CPU in float32 the files are the same on every run.
The demo model's files (assets/models/demo):
    python3 tools/calibrate_channels.py --model assets/models/demo
A big model on the GPU machine:
    python3 tools/calibrate_channels.py --model MODEL_DIR --device cuda --tokens 131072
"""

import argparse
import json
import os
import struct
import sys

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import corpus_text  # noqa: E402

LOKI_FILE = "loki_pca.safetensors"
DOUBLESPARSITY_FILE = "doublesparsity_channels.safetensors"
DEFAULT_CORPUS = os.path.join(ROOT, "..", "shared", "data", "corpus",
                              "c4-realnewslike-sample.jsonl")


def token_blocks(model_dir, corpus_files, tokens, block):
    """[n, block] token ids: the corpus files' training documents, in order, joined."""
    tokenizer_file = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(tokenizer_file):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tokenizer_file)
        encode = lambda text: tok.encode(text).ids  # noqa: E731
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_dir)
        encode = lambda text: tok(text)["input_ids"]  # noqa: E731
    ids = []
    for path in corpus_files:
        docs = corpus_text.read_documents(path, corpus_text.DEFAULT_DOC_CHARS)
        train, _ = corpus_text.heldout_split(docs, corpus_text.DEFAULT_HELDOUT_FRAC)
        for doc in train:
            ids.extend(encode(doc))
            if len(ids) >= tokens:
                break
        if len(ids) >= tokens:
            break
    n = min(tokens, len(ids)) // block
    if n == 0:
        sys.exit(f"calibrate_channels: --corpus: expected at least {block} tokens of text "
                 f"(one --block-tokens block), found {len(ids)}")
    return torch.tensor(ids[:n * block], dtype=torch.long).view(n, block)


class Statistics:
    """Per layer: the keys' sums and outer-product sums per KV head, and each query head's summed
    |q_c k_c|, all float64."""

    def __init__(self, layers, heads, kv_heads, head_dim):
        self.count = [0] * layers
        self.key_sum = torch.zeros(layers, kv_heads, head_dim, dtype=torch.float64)
        self.key_outer = torch.zeros(layers, kv_heads, head_dim, head_dim, dtype=torch.float64)
        self.qk = torch.zeros(layers, heads, head_dim, dtype=torch.float64)

    def add(self, layer, q, k):
        """q [B, H, T, D], k [B, G, T, D] after RoPE (and any q/k norm)."""
        q, k = q.double(), k.double()
        heads, groups = q.shape[1], k.shape[1]
        keys = k.transpose(1, 2).reshape(-1, groups, k.shape[-1])  # [N, G, D]
        self.count[layer] += keys.shape[0]
        self.key_sum[layer] += keys.sum(0).cpu()
        self.key_outer[layer] += torch.einsum("ngc,ngd->gcd", keys, keys).cpu()
        repeated = k.repeat_interleave(heads // groups, dim=1)  # each query head's KV head
        self.qk[layer] += (q * repeated).abs().sum(dim=(0, 2)).cpu()


def capture(model, stats):
    """Hooks on every attention module recomputing its post-RoPE q and k from its inputs."""
    hooks = []
    layers = model.model.layers
    for index, layer in enumerate(layers):
        attn = layer.self_attn
        modeling = sys.modules[type(attn).__module__]

        def hook(module, args, kwargs, index=index, modeling=modeling):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            shape = (*hidden.shape[:-1], -1, module.head_dim)
            q = module.q_proj(hidden).view(shape)
            k = module.k_proj(hidden).view(shape)
            if hasattr(module, "q_norm"):  # qwen3, gemma3: normed before RoPE
                q, k = module.q_norm(q), module.k_norm(k)
            q, k = modeling.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            stats.add(index, q, k)

        hooks.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return hooks


def principal_directions(stats, layer):
    """basis [G, D, D] (direction i in column i, by explained variance, the largest-magnitude
    entry of each positive) and the explained variance ratio [G, D]."""
    n = stats.count[layer]
    mean = stats.key_sum[layer] / n
    cov = stats.key_outer[layer] / n - torch.einsum("gc,gd->gcd", mean, mean)
    values, vectors = torch.linalg.eigh(cov)  # ascending
    values, vectors = values.flip(-1).clamp(min=0.0), vectors.flip(-1)
    pivot = vectors.abs().argmax(dim=1, keepdim=True)  # [G, 1, D]: the row of each column's peak
    signs = torch.sign(torch.gather(vectors, 1, pivot))
    signs[signs == 0] = 1.0
    vectors = vectors * signs
    total = values.sum(-1, keepdim=True).clamp(min=1e-300)
    return vectors, values / total


def save_sorted(tensors, path, metadata):
    """A safetensors file of F32 tensors whose bytes depend only on its contents: the header's
    keys sorted (safetensors' own writer orders the metadata differently from run to run), padded
    with spaces to a multiple of 8 as that writer does, then the tensors in name order."""
    header, offset, data = {"__metadata__": dict(sorted(metadata.items()))}, 0, []
    for name in sorted(tensors):
        raw = tensors[name].detach().cpu().float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face checkpoint folder")
    p.add_argument("--corpus", nargs="+", default=[DEFAULT_CORPUS],
                   help="corpus files (.txt blocks or .jsonl with \"text\"); default: the C4 "
                        "sample of ../shared/data/corpus")
    p.add_argument("--tokens", type=int, default=65536, help="calibration tokens (default 65536)")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per forward (512)")
    p.add_argument("--batch", type=int, default=8, help="blocks per forward")
    p.add_argument("--device", default="cpu", help="cpu (the demo model) or cuda")
    p.add_argument("--out", help="output folder (default: the model folder)")
    p.add_argument("--which", default="loki,doublesparsity",
                   help="files to write: loki, doublesparsity or both (default)")
    args = p.parse_args(argv)
    which = set(args.which.split(","))
    if not which or not which <= {"loki", "doublesparsity"}:
        sys.exit(f"calibrate_channels: --which: expected loki, doublesparsity or both, "
                 f"found {args.which!r}")
    for path in args.corpus:
        if not os.path.exists(path):
            sys.exit(f"calibrate_channels: --corpus: expected an existing file, found {path!r}")
    if args.tokens < 1 or args.block_tokens < 1 or args.batch < 1:
        sys.exit("calibrate_channels: --tokens, --block-tokens, --batch: expected positive counts")
    if not os.path.exists(os.path.join(args.model, "config.json")):
        sys.exit(f"calibrate_channels: --model: expected a checkpoint folder with config.json, "
                 f"found {args.model!r}")

    from transformers import AutoModelForCausalLM

    torch.use_deterministic_algorithms(True, warn_only=True)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype,
                                                 attn_implementation="eager").to(args.device)
    model.eval()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    stats = Statistics(layers, heads, kv_heads, head_dim)
    blocks = token_blocks(args.model, args.corpus, args.tokens, args.block_tokens)
    hooks = capture(model, stats)
    with torch.no_grad():
        for start in range(0, blocks.shape[0], args.batch):
            model(blocks[start:start + args.batch].to(args.device), use_cache=False)
    for hook in hooks:
        hook.remove()

    out = args.out or args.model
    os.makedirs(out, exist_ok=True)
    metadata = {"tool": "tools/calibrate_channels.py",
                "corpus": ",".join(os.path.basename(c) for c in args.corpus),
                "tokens": str(blocks.numel()), "keys": "post-rope"}
    if "loki" in which:
        bases, ratios = zip(*(principal_directions(stats, layer) for layer in range(layers)))
        save_sorted({"basis": torch.stack(bases), "explained_variance_ratio": torch.stack(ratios)},
                    os.path.join(out, LOKI_FILE), metadata)
    if "doublesparsity" in which:
        importance = stats.qk / torch.tensor(stats.count, dtype=torch.float64).view(-1, 1, 1)
        order = torch.argsort(-importance, dim=-1, stable=True)
        save_sorted({"channels": order, "importance": importance},
                    os.path.join(out, DOUBLESPARSITY_FILE), metadata)
    print(f"calibrate_channels: {blocks.numel()} tokens, {layers} layers -> {out}")


if __name__ == "__main__":
    main()
