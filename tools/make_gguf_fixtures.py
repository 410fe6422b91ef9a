#!/usr/bin/env python3
"""Writes small GGUF fixtures (tests/fixtures/gguf-models/*.gguf) from two safetensors parity
fixtures, as llama.cpp's converter lays them out, with the `gguf` package's GGUFWriter:
gemma3-window-softcap-f32 (norm weights + 1, no q/k permutation, every 3rd layer global) and
llama-gqa-f32 (q/k rows permuted per head as llama.cpp's Llama converter does), each as F32 and
as Q8_0 (2-D weights whose rows are whole 32-value blocks; the rest stays F32), with a tiny
SentencePiece-style "llama" vocabulary (control tokens, <0xNN> byte fallback, scored pieces).
Shapes: a 2-D HF weight [out, in] is written as its numpy array, which GGUF stores as ne = [in,
out]. tests/unit/test_gguf_fixtures.cpp checks the files against their folders.

usage: tools/make_gguf_fixtures.py   (needs gguf==0.19.0 and numpy; writes the four files and
                                      tests/fixtures/gguf-models/versions.json)
"""
import importlib.metadata
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "gguf-models"

# Ordinary pieces of the tiny vocabulary after the control, unknown and byte tokens ("\u2581" is
# SentencePiece's space), scored so that longer pieces merge first.
PIECES = ["\u2581the", "\u2581a", "\u2581cat", "\u2581sat", "\u2581on", "\u2581mat", "\u2581is",
          "\u2581key", "\u2581th", "he", "at", "\u2581", "t", "h", "e", "c", "a", "s", "o", "n",
          "m", "i", "k", "y", "\u2581c", "\u2581s", "\u2581o", "\u2581m", "\u2581i", "\u2581k",
          "\u2581t"]


def read_safetensors(path):
    """{name: float32 array} of an F32 safetensors file (the parity fixtures' only dtype)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            sys.exit(f"{path}: {name}: expected F32, found {entry['dtype']}")
        begin, end = entry["data_offsets"]
        raw = data[8 + size + begin:8 + size + end]
        tensors[name] = np.frombuffer(raw, dtype=np.float32).reshape(entry["shape"]).copy()
    return tensors


def tiny_vocabulary(size, bos, eos):
    """Tokens, scores and types of a SentencePiece-style vocabulary of `size` entries."""
    tokens, scores, types = [], [], []
    specials = {0: "<pad>", bos: "<bos>", eos: "<eos>"}
    for i in range(3):
        tokens.append(specials.get(i, f"<ctl{i}>"))
        scores.append(0.0)
        types.append(gguf.TokenType.CONTROL)
    tokens.append("<unk>")
    scores.append(0.0)
    types.append(gguf.TokenType.UNKNOWN)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    for rank, piece in enumerate(PIECES):
        if len(tokens) == size:
            break
        tokens.append(piece)
        scores.append(-float(rank))
        types.append(gguf.TokenType.NORMAL)
    while len(tokens) < size:  # unused filler up to the model's vocabulary
        tokens.append(f"<unused{len(tokens)}>")
        scores.append(0.0)
        types.append(gguf.TokenType.UNUSED)
    return tokens, scores, types


def add_vocabulary(writer, config):
    tokens, scores, types = tiny_vocabulary(config["vocab_size"], config["bos_token_id"],
                                            config["eos_token_id"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def permute_rows(weight, heads):
    """llama.cpp's Llama converter stores q and k with each head's rows reordered from the
    rotate-half layout (first half, second half) to interleaved pairs: row r = 2 i + k of a head
    takes row k * (D / 2) + i."""
    out, columns = weight.shape
    per_head = out // heads
    return (weight.reshape(heads, 2, per_head // 2, columns).swapaxes(1, 2)
            .reshape(out, columns))


def gguf_name(name, family):
    """The GGUF tensor name of a Hugging Face one, or None for a tensor GGUF does not keep."""
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, rest = parts[2], ".".join(parts[3:])
    post_attention = "post_attention_norm" if family == "gemma3" else "ffn_norm"
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": post_attention + ".weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{layer}.{table[rest]}" if rest in table else None


def add_tensors(writer, tensors, family, config, quantized):
    for name in sorted(tensors):
        target = gguf_name(name, family)
        if target is None:
            sys.exit(f"{name}: no GGUF name for a {family} tensor")
        data = tensors[name]
        if family == "gemma3" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # Gemma's RMSNorm scales by 1 + weight
        if family == "llama" and name.endswith("self_attn.q_proj.weight"):
            data = permute_rows(data, config["num_attention_heads"])
        if family == "llama" and name.endswith("self_attn.k_proj.weight"):
            data = permute_rows(data, config["num_key_value_heads"])
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
        if quantized and data.ndim == 2 and data.shape[1] % block == 0:
            packed = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(target, packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(target, np.ascontiguousarray(data, dtype=np.float32))


def add_shapes(writer, config):
    """The hyper-parameters every architecture writes the same way."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])


def write_gemma3(folder, path, quantized):
    config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), "gemma3")
    layers = config["layer_types"]
    pattern = layers.index("full_attention") + 1
    if any(((i + 1) % pattern == 0) != (kind == "full_attention") for i, kind in enumerate(layers)):
        sys.exit(f"{folder}: layer_types is not every {pattern}th layer global")
    rope = config["rope_parameters"]
    add_shapes(writer, config)
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    if rope["full_attention"].get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
    writer.add_sliding_window(config["sliding_window"])
    # llama.cpp assumes every 6th layer global; the fixture's 3 layers need the pattern written.
    writer.add_sliding_window_pattern(pattern)
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_vocab_size(config["vocab_size"])
    add_vocabulary(writer, config)
    writer.add_add_space_prefix(False)  # as llama.cpp's Gemma 3 converter writes
    add_tensors(writer, read_safetensors(folder / "model.safetensors"), "gemma3", config,
                quantized)
    finish(writer)


def write_llama(folder, path, quantized):
    config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), "llama")
    add_shapes(writer, config)
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    add_vocabulary(writer, config)
    add_tensors(writer, read_safetensors(folder / "model.safetensors"), "llama", config,
                quantized)
    finish(writer)


def finish(writer):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    OUT.mkdir(exist_ok=True)
    made = {}
    for source, family, write in (("gemma3-window-softcap-f32", "gemma3", write_gemma3),
                                  ("llama-gqa-f32", "llama", write_llama)):
        for quantized in (False, True):
            name = f"{source.rsplit('-', 1)[0]}-{'q8_0' if quantized else 'f32'}.gguf"
            path = OUT / name
            write(FIXTURES / source, path, quantized)
            size = path.stat().st_size
            if size >= 1 << 20:
                sys.exit(f"{path}: {size} bytes, above the 1 MiB a fixture may take")
            made[name] = {"from": source, "bytes": size}
            print(f"wrote {path.relative_to(ROOT)} ({size} bytes)")
    versions = {"gguf": importlib.metadata.version("gguf"),
                "numpy": np.__version__, "python": sys.version.split()[0], "files": made}
    (OUT / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")


if __name__ == "__main__":
    main()
