#!/usr/bin/env python3
"""Reference token ids for kvlens' GGUF tokenizer, made by llama.cpp's own llama-tokenize.

Inputs: a built llama-tokenize, SmolLM2-135M-Instruct's GGUF and ../shared/data. Outputs (under
tests/fixtures/gguf_tokenizer/): the SmolLM2 file's tokenizer.* metadata (gzipped JSON, read with
gguf-py), and for SmolLM2 and for a SentencePiece-style GGUF built here from the Llama 2
tokenizer.json the ids llama.cpp gives for the texts of ../shared/data (see texts()).
Run through tools/gguf_reference_ids.sh, which fetches and builds llama-tokenize.
"""

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile

CORPUS_BYTES = 2048  # from the start of each corpus file, cut back to a UTF-8 boundary

# Texts with the special tokens of each vocabulary, matched before pre-tokenization.
SPECIAL_TEXTS = {
    "smollm2": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 12+30?<|im_end|>\n",
        "a<|endoftext|>b <|im_end|> c<|im_start|><|im_end|>",
        "<|im_start|",
    ],
    "llama2-spm": [
        "<s>Hello</s> world",
        "Hello <s> world</s>",
        "</s></s>  x",
        "<unk> and <s>",
    ],
}


def utf8_prefix(data: bytes, limit: int) -> bytes:
    end = min(limit, len(data))
    while end > 0 and end < len(data) and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


def texts(shared: str, name: str):
    """(source, text bytes) pairs: corpus prefixes, the tokenizer cases and vectors, specials."""
    out = []
    data = os.path.join(shared, "data")
    for folder in ("corpus", "eval"):
        for fname in sorted(os.listdir(os.path.join(data, folder))):
            if fname.endswith((".txt", ".jsonl")):
                rel = f"{folder}/{fname}"
                with open(os.path.join(data, rel), "rb") as f:
                    raw = utf8_prefix(f.read(CORPUS_BYTES + 8), CORPUS_BYTES)
                out.append(({"file": rel, "bytes": len(raw)}, raw))
    for fam in ("gpt2", "llama2", "llama3"):
        rel = f"tokenizers/cases-{fam}.json"
        with open(os.path.join(data, rel), encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        for i, case in enumerate(cases):
            out.append(({"file": rel, "case": i}, case["text"].encode("utf-8")))
    for fam in ("gpt-2", "llama-spm"):
        rel = f"tokenizers/vectors-{fam}.inp"
        with open(os.path.join(data, rel), encoding="utf-8") as f:
            inputs = f.read().split("\n__ggml_vocab_test__\n")
        for i, text in enumerate(inputs):
            out.append(({"file": rel, "vector": i}, text.encode("utf-8")))
    for text in SPECIAL_TEXTS[name]:
        out.append(({"text": text}, text.encode("utf-8")))
    return out


def tokenize(tool: str, gguf_path: str, text: bytes, bos: bool):
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        cmd = [tool, "-m", gguf_path, "-f", path, "--ids", "--no-escape", "--log-disable"]
        if not bos:
            cmd.append("--no-bos")
        res = subprocess.run(cmd, capture_output=True, check=True)
    finally:
        os.unlink(path)
    line = res.stdout.decode().strip().splitlines()[-1]
    return json.loads(line)


def metadata_json(gguf_path: str):
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    out = {}
    for key, field in reader.fields.items():
        if (key.startswith("tokenizer.") and key != "tokenizer.chat_template") or key == "general.name":
            out[key] = field.contents()
    return out


def build_llama2_gguf(shared: str, path: str):
    """A vocabulary-only SentencePiece-style GGUF from the Llama 2 tokenizer.json: tokens in id
    order, types (<unk> unknown, <s> </s> control, <0xNN> byte, the rest normal) and scores -id
    (SentencePiece BPE scores fall with the order pieces were learned, which is id order)."""
    import gguf

    with open(os.path.join(shared, "data/tokenizers/llama2-tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    types, scores = [], []
    for i, text in enumerate(tokens):
        if text == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif text in ("<s>", "</s>"):
            types.append(gguf.TokenType.CONTROL)
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    w = gguf.GGUFWriter(path, "llama")
    # The hyperparameters llama.cpp reads before the vocabulary (no tensors: vocab_only).
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--llama-src", required=True, help="the llama.cpp source tree it was built from")
    ap.add_argument("--llama-version", required=True, help="where that source came from")
    ap.add_argument("--smollm2-gguf", required=True)
    ap.add_argument("--shared", required=True, help="the shared/ folder (holding data/)")
    ap.add_argument("--out", required=True, help="tests/fixtures/gguf_tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    meta = metadata_json(args.smollm2_gguf)
    with gzip.open(os.path.join(args.out, "smollm2-135m-tokenizer.json.gz"), "wt", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)

    provenance = {
        "made_by": "tools/gguf_reference_ids.py",
        "llama_cpp": args.llama_version,
        "llama_cpp_sha256": {
            p: sha256(os.path.join(args.llama_src, p)) for p in ("src/llama-vocab.cpp", "src/unicode.cpp")
        },
        "tool": "llama-tokenize -f FILE --ids --no-escape (special tokens parsed, its default)",
    }
    with tempfile.TemporaryDirectory() as tmp:
        llama2 = os.path.join(tmp, "llama2-spm-vocab.gguf")
        build_llama2_gguf(args.shared, llama2)
        for name, path in (("smollm2", args.smollm2_gguf), ("llama2-spm", llama2)):
            entries = []
            for source, text in texts(args.shared, name):
                entry = {"source": source, "ids": tokenize(args.llama_tokenize, path, text, False)}
                if "bytes" not in source:
                    entry["ids_with_special"] = tokenize(args.llama_tokenize, path, text, True)
                entries.append(entry)
            doc = dict(provenance, gguf=os.path.basename(path), entries=entries)
            with open(os.path.join(args.out, f"ids-{name}.json"), "w", encoding="utf-8") as f:
                json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
                f.write("\n")
            print(f"{name}: {len(entries)} texts", file=sys.stderr)


if __name__ == "__main__":
    main()
