#!/usr/bin/env python3
"""Reference token ids for kvlens' GGUF tokenizer, made by llama.cpp's own tokenizer.

Inputs: tools/gguf_tokenize_batch.cpp built against llama.cpp, SmolLM2-135M-Instruct's GGUF and ../shared/data. Outputs (under
tests/fixtures/gguf_tokenizer/): the SmolLM2 file's tokenizer.* metadata (gzipped JSON, read with
gguf-py), and for SmolLM2 and for vocabulary-only GGUFs built here from tokenizer.json files
(BUILT) the ids llama.cpp gives for the texts of ../shared/data (see texts()).
The driver is built by hand outside the repository (tests/fixtures/gguf_tokenizer/README.md):
kvlens commits no llama.cpp code, build of it or script that builds it.
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
    "llama2-spm-noprefix": ["<s>Hello</s> world", "  two spaces", "x<unk>y"],
    "phi3-spm": [
        "<|user|>\nHi there<|end|>\n<|assistant|>  Hello</s>  x",
        "<|system|> a <|endoftext|> b <s> c",
    ],
    "gpt2": ["a<|endoftext|>b <|endoftext|> c"],
    "gpt2-default": ["x=1234567; y += f(a,b)...!? \u00bfQu\u00e9? \u2014 \u00ab1\u00bb `q` $5"],
    "llama3": ["plain text, no specials: 1234567 it's"],
    "phi4-mini-gpt4o": [
        "\u00c9COLE \u00d6l\u00e7\u00fc STRA\u00dfE \u01c5emal e\u0301t\u00e9 \u0391\u03b8\u03ae\u03bd\u03b1 HELLO's Ok'LL 12345 a/b\n/"
    ],
    "qwen2": [
        "<|im_start|>user\n<tool_call>x</tool_call><|im_end|>\n",
        "<|endoftext|><|fim_prefix|>def f():<|fim_suffix|>",
    ],
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


# Ill-formed UTF-8 (a bad lead byte, truncated sequences, stray continuation bytes), for every
# vocabulary: llama.cpp reads it its own way, and so must kvlens.
INVALID_UTF8 = [b"\xff abc", b"caf\xc3", b"\xe2\x82 x \x80\x80y", b"ok \xf0\x9f\x98", b"\xc3\xa9\xc3"]


def utf8_prefix(data: bytes, limit: int) -> bytes:
    end = min(limit, len(data))
    while end > 0 and end < len(data) and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


def texts(shared: str, name: str):
    """(source, text bytes) pairs: corpus prefixes, the tokenizer cases and vectors, specials."""
    out = []
    data = os.path.join(shared, "data")
    corpus_folders = ("corpus", "eval") if name in ("smollm2", "llama2-spm") else ()
    for folder in corpus_folders:
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
    for raw in INVALID_UTF8:
        out.append(({"text_hex": raw.hex()}, raw))
    return out


def run_batch(tool: str, gguf_path: str, items, added_prefix):
    """llama.cpp's ids and detokenized texts for every text, from one run of the batch driver."""
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
        f.write(b"\0".join(text for _, text in items))
        path = f.name
    try:
        res = subprocess.run([tool, gguf_path, path], capture_output=True, check=True)
    finally:
        os.unlink(path)
    lines = res.stdout.decode().split("\n")
    assert len(lines) >= 4 * len(items), (len(lines), len(items))
    entries = []
    for k, (source, text) in enumerate(items):
        plain, special, decoded, decoded_skip = lines[4 * k : 4 * k + 4]
        entry = {"source": source, "ids": [int(x) for x in plain.split()]}
        with_special = [int(x) for x in special.split()]
        # Kept only where it is not the ids after the file's added prefix (BOS or nothing).
        if with_special != added_prefix + entry["ids"]:
            entry["ids_with_special"] = with_special
        # Decoded texts only where they differ from the input (most round-trip).
        for key, hexed in (("decoded", decoded), ("decoded_skip_special", decoded_skip)):
            raw = bytes.fromhex(hexed)
            if raw != text:
                try:
                    entry[key] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    entry[key + "_hex"] = hexed
        entries.append(entry)
    return entries


def metadata_json(gguf_path: str):
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    out = {}
    for key, field in reader.fields.items():
        if (key.startswith("tokenizer.") and key != "tokenizer.chat_template") or key == "general.name":
            out[key] = field.contents()
    return out


# Vocabularies built here from tokenizer.json files (the converter's rules, vocabulary only):
# name -> (file, tokenizer.ggml.model, tokenizer.ggml.pre, general.name, bos, eos, unk, add_bos[,
# add_space_prefix]).
# SentencePiece-style scores are -id: SentencePiece BPE scores fall in the order pieces were
# learned, which is id order.
BUILT = {
    "llama2-spm": ("shared:data/tokenizers/llama2-tokenizer.json", "llama", None, "llama2", 1, 2, 0, True),
    "llama2-spm-noprefix": ("shared:data/tokenizers/llama2-tokenizer.json", "llama", None, "gemma-style", 1, 2, 0,
                            True, False),
    "phi3-spm": ("repo:tests/fixtures/tokenizers/phi3-mini-tokenizer.json.gz", "llama", None,
                 "Phi-3-mini-4k-instruct", 1, 32000, 0, True),
    "gpt2": ("shared:data/tokenizers/gpt2-tokenizer.json", "gpt2", "gpt-2", "gpt2", 50256, 50256, -1, False),
    "gpt2-default": ("shared:data/tokenizers/gpt2-tokenizer.json", "gpt2", "default", "gpt2", 50256, 50256, -1,
                     False),
    "phi4-mini-gpt4o": ("repo:tests/fixtures/tokenizers/phi4-mini-style-tokenizer.json.gz", "gpt2", "gpt-4o",
                        "phi4-mini-style", -1, -1, -1, False),
    "llama3": ("shared:data/tokenizers/llama3-tokenizer.json.gz", "gpt2", "llama-bpe", "llama3", -1, -1, -1,
               False),
    "qwen2": ("repo:tests/fixtures/tokenizers/qwen2.5-tokenizer.json.gz", "gpt2", "qwen2", "qwen2.5",
              -1, 151645, -1, False),
}


def load_json(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def vocabulary(tj, spm: bool):
    """(tokens, types, scores, merges) by id, as the GGUF converter lays them out."""
    import gguf

    ids = dict(tj["model"]["vocab"])
    added = {a["id"]: a for a in tj.get("added_tokens") or []}
    for i, a in added.items():
        ids[a["content"]] = i
    n = max(ids.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for text, i in ids.items():
        tokens[i] = text
        if i in added:
            types[i] = gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED
        elif text == "<unk>":
            types[i] = gguf.TokenType.UNKNOWN
        elif spm and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i] = gguf.TokenType.BYTE
        else:
            types[i] = gguf.TokenType.NORMAL
    scores = [-float(i) for i in range(n)]
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tj["model"]["merges"]]
    return tokens, types, scores, merges


def build_gguf(name: str, shared: str, repo: str, path: str):
    import gguf

    src, model, pre, gname, bos, eos, unk, add_bos = BUILT[name][:8]
    add_space_prefix = BUILT[name][8] if len(BUILT[name]) > 8 else None
    where, rel = src.split(":", 1)
    tj = load_json(os.path.join(shared if where == "shared" else repo, rel))
    tokens, types, scores, merges = vocabulary(tj, model == "llama")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(gname)
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
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if model == "llama":
        w.add_token_scores(scores)
    else:
        w.add_token_merges(merges)
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id), (unk, w.add_unk_token_id)):
        if value >= 0:
            add(value)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gz_json(path: str, doc):
    """Gzipped JSON with no timestamp in the header, so a rerun rewrites identical bytes."""
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(data)


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenize-batch", required=True, help="tools/gguf_tokenize_batch.cpp, built")
    ap.add_argument("--llama-src", required=True, help="the llama.cpp source tree it was built from")
    ap.add_argument("--llama-version", required=True, help="where that source came from")
    ap.add_argument("--smollm2-gguf", required=True)
    ap.add_argument("--shared", required=True, help="the shared/ folder (holding data/)")
    ap.add_argument("--out", required=True, help="tests/fixtures/gguf_tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    write_gz_json(os.path.join(args.out, "smollm2-135m-tokenizer.json.gz"), metadata_json(args.smollm2_gguf))

    provenance = {
        "made_by": "tools/gguf_reference_ids.py",
        "llama_cpp": args.llama_version,
        "llama_cpp_sha256": {
            p: sha256(os.path.join(args.llama_src, p)) for p in ("src/llama-vocab.cpp", "src/unicode.cpp")
        },
        "tool": "tools/gguf_tokenize_batch.cpp: llama_tokenize (parse_special true) and llama_detokenize",
    }
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        vocabs = [("smollm2", args.smollm2_gguf)]
        for name in BUILT:
            path = os.path.join(tmp, f"{name}-vocab.gguf")
            build_gguf(name, args.shared, repo, path)
            vocabs.append((name, path))
        for name, path in vocabs:
            # What add_special puts before the ids: llama.cpp's answer for an empty text.
            prefix = run_batch(args.tokenize_batch, path, [({"text": ""}, b"")], [])[0]
            added_prefix = prefix.get("ids_with_special", [])
            entries = run_batch(args.tokenize_batch, path, texts(args.shared, name), added_prefix)
            doc = dict(provenance, gguf=os.path.basename(path), added_prefix=added_prefix,
                       entries=entries)
            write_gz_json(os.path.join(args.out, f"ids-{name}.json.gz"), doc)
            print(f"{name}: {len(entries)} texts", file=sys.stderr)


if __name__ == "__main__":
    main()
