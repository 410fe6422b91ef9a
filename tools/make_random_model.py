#!/usr/bin/env python3
"""Writes a random Llama checkpoint folder (config.json + model.safetensors) for benchmarks.

Standard library only. Sizes come from --params-target (e.g. 100M) or explicit dimensions;
weights are F32 or BF16. Example: make_random_model.py --out /tmp/rand100m --params-target 100M

The values are not independent draws: one block of seeded Gaussian values (a few MB) is generated
once and every tensor is a copy of that block tiled from its own starting offset. That is fine
for what these checkpoints are for: decode speed does not depend on the values (every weight is
read and multiplied whatever it holds, there are no data-dependent shortcuts), so a bandwidth
bench only needs the right sizes, layout and finite, non-denormal numbers. The offsets differ per
tensor so no two tensors are byte-identical and attention patterns are not degenerate. Pure
Python would need minutes to draw 100M independent values; tiling takes seconds. Do not use these
files for anything that depends on the weights being statistically independent.
"""

import argparse
import array
import json
import math
import os
import random
import struct
import sys

BLOCK_VALUES = 1 << 20  # 1M values: 4 MiB as F32


def parse_count(text):
    """'100M' -> 100_000_000; accepts K, M, G suffixes and plain integers."""
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        return int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count like 100M, got {text!r}")


def round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def intermediate_for(hidden):
    """Llama's rule: 8/3 * hidden, rounded up to a multiple of 256."""
    return round_up(int(8 * hidden / 3), 256)


def count_params(hidden, layers, intermediate, vocab, heads, kv_heads, head_dim, tied):
    per_layer = (
        hidden * heads * head_dim  # q
        + 2 * hidden * kv_heads * head_dim  # k, v
        + heads * head_dim * hidden  # o
        + 3 * hidden * intermediate  # gate, up, down
        + 2 * hidden  # two norms
    )
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * per_layer + embeddings + hidden


def choose_dims(target, vocab, tied):
    """Hidden size and depth whose parameter count is near `target`.

    For each candidate width the depth that hits the target is solved for; the width is kept
    whose depth is closest (on a log scale) to Llama's usual aspect ratio, layers ~ hidden / 64.
    """
    best = None
    for hidden in (128, 256, 384, 512, 640, 768, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 5120):
        heads = hidden // 64
        inter = intermediate_for(hidden)
        fixed = count_params(hidden, 0, inter, vocab, heads, heads, 64, tied)
        one_layer = count_params(hidden, 1, inter, vocab, heads, heads, 64, tied) - fixed
        remaining = target - fixed
        if remaining < one_layer:
            continue
        layers = max(1, round(remaining / one_layer))
        score = abs(math.log(layers / (hidden / 64)))
        if best is None or score < best[0]:
            best = (score, hidden, layers, inter)
    if best is None:
        raise SystemExit(f"--params-target {target} is too small for a {vocab}-token vocabulary")
    return best[1], best[2], best[3]


def gaussian_block(seed, std):
    rng = random.Random(seed)
    gauss = rng.gauss
    values = array.array("f", (gauss(0.0, std) for _ in range(BLOCK_VALUES)))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def bf16_bytes(f32_bytes):
    """Top two bytes of each little-endian F32 (truncation; exact enough for random data)."""
    out = bytearray(len(f32_bytes) // 2)
    out[0::2] = f32_bytes[2::4]
    out[1::2] = f32_bytes[3::4]
    return bytes(out)


class TensorWriter:
    """Streams tensors of tiled block data into a safetensors file."""

    def __init__(self, dtype, block_f32):
        self.dtype = dtype
        self.element = 4 if dtype == "F32" else 2
        block = block_f32 if dtype == "F32" else bf16_bytes(block_f32)
        self.block = block + block  # doubled, so any offset can take one contiguous slice
        self.block_len = len(block)
        one = struct.pack("<f", 1.0)
        self.one = one if dtype == "F32" else one[2:4]
        self.entries = []  # (name, shape, kind, offset_seed)

    def add(self, name, shape, kind="random", offset_seed=0):
        self.entries.append((name, shape, kind, offset_seed))

    def write_shards(self, out_dir, shards, shard_dirs):
        """Writes the tensors in `shards` files of about equal size (the Hugging Face layout:
        model-0000i-of-0000n.safetensors and model.safetensors.index.json). Shard i goes into
        shard_dirs[i % len(shard_dirs)] and, where that is not out_dir, a symbolic link in out_dir
        points to it: a checkpoint larger than one disk spread over a disk and a memory folder."""
        if shards <= 1:
            self.write(os.path.join(out_dir, "model.safetensors"))
            return
        total = sum(math.prod(shape) * self.element for _, shape, _, _ in self.entries)
        groups, current, size = [], [], 0
        for entry in self.entries:
            current.append(entry)
            size += math.prod(entry[1]) * self.element
            if size >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
                groups.append(current)
                current = []
        groups.append(current)
        weight_map = {}
        for i, group in enumerate(groups):
            name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            folder = shard_dirs[i % len(shard_dirs)] if shard_dirs else out_dir
            os.makedirs(folder, exist_ok=True)
            part = TensorWriter.__new__(TensorWriter)
            part.__dict__.update(self.__dict__)
            part.entries = group
            part.write(os.path.join(folder, name))
            if os.path.abspath(folder) != os.path.abspath(out_dir):
                link = os.path.join(out_dir, name)
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(os.path.abspath(os.path.join(folder, name)), link)
            for entry in group:
                weight_map[entry[0]] = name
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
            f.write("\n")

    def write(self, path):
        header = {"__metadata__": {"format": "pt"}}
        begin = 0
        for name, shape, _, _ in self.entries:
            size = math.prod(shape) * self.element
            header[name] = {"dtype": self.dtype, "shape": shape, "data_offsets": [begin, begin + size]}
            begin += size
        header_bytes = json.dumps(header, separators=(",", ":")).encode()
        header_bytes += b" " * (-len(header_bytes) % 8)  # keeps the data section 8-byte aligned
        with open(path, "wb") as out:
            out.write(struct.pack("<Q", len(header_bytes)))
            out.write(header_bytes)
            for _, shape, kind, offset_seed in self.entries:
                size = math.prod(shape) * self.element
                if kind == "ones":
                    out.write(self.one * (size // self.element))
                    continue
                # A per-tensor start (a multiplicative hash of its index), element-aligned; each
                # further block-sized piece starts a little further on, so rows do not repeat
                # with the block's period.
                elements = self.block_len // self.element
                position = (offset_seed * 2654435761 % elements) * self.element
                left = size
                while left > 0:
                    take = min(left, self.block_len)
                    out.write(self.block[position : position + take])
                    left -= take
                    position = (position + take + 997 * self.element) % self.block_len


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--params-target", type=parse_count, default=parse_count("100M"),
                        help="approximate parameter count, e.g. 20M, 100M, 1G (default 100M)")
    parser.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    parser.add_argument("--hidden", type=int, help="hidden size (overrides the target's choice)")
    parser.add_argument("--layers", type=int, help="number of layers")
    parser.add_argument("--intermediate", type=int, help="MLP width (default 8/3 hidden, /256)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--heads", type=int, help="attention heads (default hidden / 64)")
    parser.add_argument("--kv-heads", type=int, help="KV heads (default = heads)")
    parser.add_argument("--tie-embeddings", action="store_true", help="share embed and lm_head")
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.02, help="weight standard deviation")
    parser.add_argument("--shards", type=int, default=1,
                        help="files of about equal size (with model.safetensors.index.json)")
    parser.add_argument("--shard-dirs", default="",
                        help="comma-separated folders the shards go to in turn, linked from --out "
                             "(a checkpoint larger than one disk: a disk folder and /dev/shm)")
    args = parser.parse_args()

    tied = args.tie_embeddings
    if args.hidden:
        hidden = args.hidden
        layers = args.layers or max(1, hidden // 64)
        inter = args.intermediate or intermediate_for(hidden)
    else:
        hidden, layers, inter = choose_dims(args.params_target, args.vocab, tied)
        layers = args.layers or layers
        inter = args.intermediate or inter
    heads = args.heads or max(1, hidden // 64)
    kv_heads = args.kv_heads or heads
    if hidden % heads or heads % kv_heads:
        raise SystemExit("hidden must be divisible by heads, and heads by kv-heads")
    head_dim = hidden // heads
    vocab = args.vocab

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": args.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32" if args.dtype == "F32" else "bfloat16",
    }

    writer = TensorWriter(args.dtype, gaussian_block(args.seed, args.std))
    index = 0

    def add(name, shape, kind="random"):
        nonlocal index
        index += 1
        writer.add(name, shape, kind, index)

    add("model.embed_tokens.weight", [vocab, hidden])
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", [hidden], "ones")
        add(p + "self_attn.q_proj.weight", [heads * head_dim, hidden])
        add(p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden])
        add(p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden])
        add(p + "self_attn.o_proj.weight", [hidden, heads * head_dim])
        add(p + "post_attention_layernorm.weight", [hidden], "ones")
        add(p + "mlp.gate_proj.weight", [inter, hidden])
        add(p + "mlp.up_proj.weight", [inter, hidden])
        add(p + "mlp.down_proj.weight", [hidden, inter])
    add("model.norm.weight", [hidden], "ones")
    if not tied:
        add("lm_head.weight", [vocab, hidden])

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    shard_dirs = [d for d in args.shard_dirs.split(",") if d]
    writer.write_shards(args.out, args.shards, shard_dirs)
    params = count_params(hidden, layers, inter, vocab, heads, kv_heads, head_dim, tied)
    print(
        f"{args.out}: {params / 1e6:.1f}M parameters ({args.dtype}), hidden {hidden}, "
        f"{layers} layers, intermediate {inter}, heads {heads}/{kv_heads}, vocab {vocab}, "
        f"tied {str(tied).lower()}"
    )


if __name__ == "__main__":
    main()
