#!/usr/bin/env python3
"""Builds the tokenizer reference fixtures under tests/fixtures/tokenizers/ with Hugging Face
`tokenizers`, so tests/unit/test_tokenizer_families.cpp can check that kvlens encodes and decodes
exactly like it for the Qwen2/Qwen2.5/Qwen3 and Phi-3/Phi-4 tokenizer families.

Tokenizers (see tests/fixtures/tokenizers/README.md for where each file comes from):

  qwen2.5     qwen2.5-tokenizer.json.gz: the Qwen2/2.5/3 vocabulary and merges (151643 BPE
              entries), NFC normalizer, Qwen2 split regex, ByteLevel, the 22 Qwen2.5 added
              tokens. Committed; `--assemble-qwen2` rebuilds it from the genuine vocab.json,
              merges.txt and tokenizer_config.json.
  phi3-mini   phi3-mini-tokenizer.json.gz: Phi-3-mini-4k-instruct's own tokenizer.json
              (SentencePiece-style BPE, byte fallback, rstrip added tokens). Committed as is.
  phi4-style  constructed here from the Llama 3 file in ../shared (its first 32768 ids are
              cl100k_base's): Phi-4's pipeline (cl100k split regex as a Removed/inverted Split,
              ByteLevel) and Phi-4's 96 added tokens (lstrip and rstrip), numbered from 32768
              (HF numbers added tokens after the vocab whatever ids a file lists).
  phi4-mini-style  the same vocabulary with Phi-4-mini's o200k split regex (case classes,
              contraction suffixes) and Phi-4-mini's 12 added tokens (rstrip, some not special),
              likewise numbered from 32768.

For each one it writes cases-<name>.json: for texts drawn from ../shared/data (an excerpt or
two of every corpus file, WikiText) and hand-written edge cases, `ids` =
encode(text, add_special_tokens=False), `ids_with_special` (only where it differs), `decoded` =
decode(ids) and `decoded_skip_special` = decode(ids, skip_special_tokens=True); plus `decodes`:
id sequences (single ids, cut multi-byte characters, added tokens, seeded random ids) with their
decode() with and without skip_special_tokens.

Everything is deterministic. Run it from anywhere (it finds ../shared/data beside the checkout or
shared/data inside it; --shared DIR names another):

    python3 tools/make_tokenizer_fixtures.py            # write the fixtures
    python3 tools/make_tokenizer_fixtures.py --check    # regenerate in memory, compare, exit 1
                                                          # on any difference
"""

import argparse
import gzip
import io
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
# ../shared/data beside the checkout, or shared/data inside it (as a copy of the tree may carry
# it); --shared overrides both.
SHARED = next((p for p in (os.path.join(os.path.dirname(ROOT), "shared", "data"),
                           os.path.join(ROOT, "shared", "data")) if os.path.isdir(p)),
              os.path.join(os.path.dirname(ROOT), "shared", "data"))

QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CL100K_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_REGEX = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# The constructed vocabularies keep the first CONSTRUCTED_IDS ids of cl100k_base (Llama 3's first
# 100256 ids are cl100k_base's): enough for real merges on every text, small enough to commit.
CONSTRUCTED_IDS = 32768

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": False}


def added(id_, content, special=True, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": False, "special": special}


def phi4_added_tokens():
    # Phi-4's tokenizer_config.json: 100256..100351, every one lstrip + rstrip + special.
    names = {100256: "<|dummy_0|>", 100257: "<|endoftext|>", 100258: "<|fim_prefix|>",
             100259: "<|fim_middle|>", 100260: "<|fim_suffix|>", 100264: "<|im_start|>",
             100265: "<|im_end|>", 100266: "<|im_sep|>"}
    dummy = 1
    out = []
    for id_ in range(100256, 100352):
        if id_ not in names:
            names[id_] = "<|dummy_%d|>" % dummy
            dummy += 1
        out.append(added(id_, names[id_], lstrip=True, rstrip=True))
    return out


def phi4_mini_added_tokens():
    # Phi-4-mini's tokenizer_config.json (the tool tokens are not special).
    plain = [(199999, "<|endoftext|>"), (200018, "<|endofprompt|>")]
    rstrip = [(200019, "<|assistant|>", True), (200020, "<|end|>", True),
              (200021, "<|user|>", True), (200022, "<|system|>", True),
              (200023, "<|tool|>", False), (200024, "<|/tool|>", False),
              (200025, "<|tool_call|>", False), (200026, "<|/tool_call|>", False),
              (200027, "<|tool_response|>", False), (200028, "<|tag|>", True)]
    return [added(i, c) for i, c in plain] + [added(i, c, special=s, rstrip=True)
                                              for i, c, s in rstrip]


def read_json_maybe_gz(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return json.loads(data.decode("utf-8"))


def gzip_bytes(data):
    # mtime 0 and no file name, so the same JSON always gives the same bytes with one zlib.
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as g:
        g.write(data)
    return out.getvalue()


def dump_tokenizer(obj):
    return (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def construct(kind):
    """A constructed tokenizer.json (bytes) from the Llama 3 file in ../shared."""
    llama3 = read_json_maybe_gz(os.path.join(SHARED, "tokenizers", "llama3-tokenizer.json.gz"))
    vocab_all = llama3["model"]["vocab"]
    vocab = {t: i for t, i in vocab_all.items() if i < CONSTRUCTED_IDS}
    merges = []
    for m in llama3["model"]["merges"]:
        left, right = m.split(" ", 1) if isinstance(m, str) else m
        merged = vocab.get(left + right)
        if merged is not None and left in vocab and right in vocab:
            merges.append(left + " " + right)
    if kind == "phi4-style":
        split = {"type": "Split", "pattern": {"Regex": CL100K_REGEX}, "behavior": "Removed",
                 "invert": True}
        added_tokens = phi4_added_tokens()
    else:
        split = {"type": "Split", "pattern": {"Regex": O200K_REGEX}, "behavior": "Isolated",
                 "invert": False}
        added_tokens = phi4_mini_added_tokens()
    for n, token in enumerate(added_tokens):
        token["id"] = CONSTRUCTED_IDS + n
    obj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, BYTE_LEVEL]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return dump_tokenizer(obj)


def assemble_qwen2(vocab_path, merges_path, config_path):
    """Qwen2.5's tokenizer.json from its vocab.json, merges.txt and tokenizer_config.json, in the
    layout of the genuine file (NFC, Split + ByteLevel, ByteLevel post-processor and decoder)."""
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_path, "rb") as f:
        lines = f.read().replace(b"\r\n", b"\n").decode("utf-8").split("\n")
    merges = [line for line in lines[1:] if line]  # line 0 is "#version: 0.2"
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    added_tokens = []
    for id_, t in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0])):
        added_tokens.append({"id": int(id_), "content": t["content"],
                             "single_word": t["single_word"], "lstrip": t["lstrip"],
                             "rstrip": t["rstrip"], "normalized": t["normalized"],
                             "special": t["special"]})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    obj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
             "invert": False}, byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    assert len(vocab) == 151643 and len(merges) == 151387, (len(vocab), len(merges))
    return dump_tokenizer(obj)


# ---- texts ----

def excerpt(text, start, length):
    """length chars from the line start at or after `start` (whole text lines, no cut)."""
    at = text.find("\n", start)
    at = 0 if at < 0 else at + 1
    return text[at:at + length]


def non_ascii_excerpt(text, length):
    """The first line with at least 3 non-ASCII chars past the text's first tenth, widened to
    `length` chars from its start."""
    pos = len(text) // 10
    while True:
        end = text.find("\n", pos)
        if end < 0:
            return None
        line = text[pos:end]
        if sum(1 for c in line if ord(c) > 127) >= 3:
            return text[pos:pos + length]
        pos = end + 1


def corpus_texts():
    texts = []
    corpus = os.path.join(SHARED, "corpus")
    for name in sorted(os.listdir(corpus)):
        path = os.path.join(corpus, name)
        if name.endswith(".txt"):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            texts.append(excerpt(text, len(text) * 37 // 100, 400))
            extra = non_ascii_excerpt(text, 300)
            texts.append(extra if extra else excerpt(text, len(text) * 81 // 100, 300))
        elif name.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                docs = [json.loads(line)["text"] for line in f if line.strip()]
            texts += [docs[0][:500], docs[len(docs) // 2][:400]]
            texts += [d[:300] for d in docs if sum(1 for c in d[:300] if ord(c) > 127) >= 3][:2]
    for name in ("wikitext2-test.txt", "wikitext2-valid.txt"):
        with open(os.path.join(SHARED, "eval", name), encoding="utf-8") as f:
            text = f.read()
        texts.append(excerpt(text, len(text) // 3, 500))
        texts.append(excerpt(text, len(text) * 2 // 3, 300))
    return texts


EDGE_TEXTS = [
    "", " ", "   ", "\n", "\n\n\n", "\t", "a", " a", "  a", "a ", "a  ", "Hello world",
    " Hello world", "Hello World!", "HELLO WORLD", "hello   world", "trailing spaces   \n",
    "tabs\tand\t\ttabs", "    indented code\n\tdef f(x):\n\t\treturn x  # comment\n",
    "line1\r\nline2\r\n\r\nline3\r", "\r\n", "a\rb", " \n \n", "x\n\n  \ny",
    "1234567890", "3.14159 and 1,000,000 and 0x1F", "12 345 6789 00000", "v2.0.1-rc3",
    "\uff13\uff14\uff15 fullwidth, \u0661\u0662\u0663 Arabic-Indic, \u216b \u00bd \u00b2",
    "I'm sure you're right, they'll see we've done it'd", "I'M SURE YOU'RE RIGHT, IT'S",
    "don't DON'T Don'T 'S 's 'x ''", "it\u2019s curly and \u017f long s'\u017f",
    "CamelCaseWord HTTPServer iPhone McDonald's O'Neil", "ALLCAPS'LL lower'VE Mixed'D",
    "e\u0301 Cafe\u0301 \u212b \u2126 \u1100\u1161\u11a8 \ufb01 \u00c5",  # NFC changes these
    "Ti\u1ebfng Vi\u1ec7t, \u0928\u092e\u0938\u094d\u0924\u0947, \u0645\u0631\u062d\u0628\u0627",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3002\u30ab\u30bf\u30ab\u30ca \uc548\ub155\ud558\uc138\uc694",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u05e9\u05dc\u05d5\u05dd \u03b3\u03b5\u03b9\u03ac \u043f\u0440\u0438\u0432\u0435\u0442",
    "\U0001f44b\U0001f3fd family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"
    " flag \U0001f1fa\U0001f1f8 \U0001f999 llama",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 \u16a0\u16c7\u16bb"
    " \U00013000",
    "zero\u200bwidth\u200djoin \ufeffbom \u00a0nbsp\u3000ideographic\u2028line\u2029para",
    "\x00nul \x01\x02 \x7f del \u0085nel \ufffd replacement \ufffe \uffff \ue000 private",
    "\u2581 lower one eighth block \u2581\u2581 and \u0120 and \u010a",
    "!!!??? ... --- === *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} <<< >>> ///",
    "a/b/c/ //x\n//\n/ path/to/file.txt\r\n/usr/bin/",
    "https://example.com/a?b=c&d=e#f email@example.org",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|>", "text<|endoftext|>more", " <|endoftext|> ", "<|endoftext|><|endoftext|>",
    "<|im_start|", "<|im_start|><|im_start|", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<think>\nhmm\n</think>\n\nanswer", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n4<|end|>\n",
    "<|system|>  You are kind.  <|end|>  \n<|user|> hi <|end|>", "<s> x </s> y <unk> z",
    "</s>   after", "a</s>b", "<|placeholder1|><|placeholder6|>",
    "<|im_sep|>", "x <|im_start|> y <|im_sep|>  z  <|im_end|>\n", "  <|dummy_0|>  a",
    "<|endofprompt|> <|tool|> x <|/tool|> <|tool_call|>  f  <|/tool_call|>",
    "<|tool_response|>\n ok <|tag|>", "<|END|> <|User|> < |end| >",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "=" * 70 + "\n" + "-" * 70, "    " * 20 + "x", "\n" * 12 + "x",
    "The quick brown fox jumps over the lazy dog. " * 6,
]


def all_texts():
    return corpus_texts() + EDGE_TEXTS


# ---- references ----

def decode_sequences(tok, cases, seed):
    size = tok.get_vocab_size(with_added_tokens=True)
    valid = [i for i in range(size) if tok.id_to_token(i) is not None]
    added_ids = sorted(tok.get_added_tokens_decoder().keys())
    seqs = []
    for ids in (c["ids"] for c in cases):
        if len(ids) >= 3:
            seqs.append(ids[:1])
            seqs.append(ids[1:3])
    seqs = seqs[:40]
    rng = random.Random(seed)
    seqs += [[rng.choice(valid)] for _ in range(40)]
    seqs += [[rng.choice(valid) for _ in range(12)] for _ in range(6)]
    seqs += [[a] for a in added_ids[:12]]
    if added_ids:
        hello = tok.encode("Hello world", add_special_tokens=False).ids
        seqs.append([added_ids[0]] + hello + [added_ids[-1]] + hello)
    out = []
    for ids in seqs:
        out.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                    "text_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


def references(name, tokenizer_json):
    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    cases = []
    for text in all_texts():
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        with_special = tok.encode(text, add_special_tokens=True).ids
        if with_special != ids:
            case["ids_with_special"] = with_special
        case["decoded"] = tok.decode(ids, skip_special_tokens=False)
        case["decoded_skip_special"] = tok.decode(ids, skip_special_tokens=True)
        cases.append(case)
    seed = sum(ord(c) for c in name)
    doc = {"tokenizer": name, "generator": "tools/make_tokenizer_fixtures.py",
           "tokenizers_version": tokenizers.__version__,
           "vocab_size": tok.get_vocab_size(with_added_tokens=True),
           "cases": cases, "decodes": decode_sequences(tok, cases, seed)}
    return doc


def dump_cases(doc):
    # One case per line: small, and a changed case is one changed line in a diff.
    head = {k: v for k, v in doc.items() if k not in ("cases", "decodes")}
    lines = ["{"]
    for k, v in head.items():
        lines.append("%s: %s," % (json.dumps(k), json.dumps(v, ensure_ascii=False)))
    for key in ("cases", "decodes"):
        lines.append("%s: [" % json.dumps(key))
        items = [json.dumps(c, ensure_ascii=False) for c in doc[key]]
        lines.append(",\n".join(items))
        lines.append("]," if key == "cases" else "]")
    lines.append("}")
    return ("\n".join(lines) + "\n").encode("utf-8")


COMMITTED = {"qwen2.5": "qwen2.5-tokenizer.json.gz", "phi3-mini": "phi3-mini-tokenizer.json.gz"}
CONSTRUCTED = {"phi4-style": "phi4-style-tokenizer.json.gz",
               "phi4-mini-style": "phi4-mini-style-tokenizer.json.gz"}


def outputs():
    """(path, bytes, compare-decompressed) for every fixture file this script writes."""
    files = []
    for name in list(COMMITTED) + list(CONSTRUCTED):
        if name in COMMITTED:
            path = os.path.join(FIXTURES, COMMITTED[name])
            with open(path, "rb") as f:
                tokenizer_json = gzip.decompress(f.read())
        else:
            tokenizer_json = construct(name)
            files.append((os.path.join(FIXTURES, CONSTRUCTED[name]), gzip_bytes(tokenizer_json),
                          True))
        doc = references(name, tokenizer_json)
        files.append((os.path.join(FIXTURES, "cases-%s.json" % name), dump_cases(doc), False))
        print("%-16s %d texts, %d decodes, vocab %d" % (name, len(doc["cases"]),
                                                       len(doc["decodes"]), doc["vocab_size"]))
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed fixtures instead of writing them")
    parser.add_argument("--assemble-qwen2", nargs=3, metavar=("VOCAB", "MERGES", "CONFIG"),
                        help="rebuild qwen2.5-tokenizer.json.gz from Qwen2.5's vocab.json, "
                             "merges.txt and tokenizer_config.json, then exit")
    parser.add_argument("--shared", metavar="DIR",
                        help="the shared data folder (default: ../shared/data or shared/data)")
    args = parser.parse_args()
    if args.shared:
        global SHARED
        SHARED = args.shared
    print("tokenizers %s, Python %s, data %s" % (tokenizers.__version__,
                                                 sys.version.split()[0], SHARED))

    if args.assemble_qwen2:
        data = assemble_qwen2(*args.assemble_qwen2)
        path = os.path.join(FIXTURES, COMMITTED["qwen2.5"])
        with open(path, "wb") as f:
            f.write(gzip_bytes(data))
        print("wrote", path, len(data), "bytes of JSON")
        return 0

    failures = 0
    for path, data, gz in outputs():
        rel = os.path.relpath(path, ROOT)
        if not args.check:
            with open(path, "wb") as f:
                f.write(data)
            print("wrote %s (%d bytes)" % (rel, len(data)))
            continue
        try:
            with open(path, "rb") as f:
                old = f.read()
        except OSError as e:
            print("MISSING %s: %s" % (rel, e))
            failures += 1
            continue
        if gz:  # compare content: gzip bytes may differ between zlib builds
            old, data = gzip.decompress(old), gzip.decompress(data)
        elif old != data:
            # The references, not the provenance: a run with another `tokenizers` release that
            # gives the same ids and texts passes (and says which releases).
            old_doc, new_doc = json.loads(old), json.loads(data)
            versions = (old_doc.pop("tokenizers_version", None),
                        new_doc.pop("tokenizers_version", None))
            if old_doc == new_doc:
                print("same    %s (made with tokenizers %s, checked with %s)" % ((rel,) + versions))
                continue
        if old != data:
            failures += 1
            print("DIFFERS %s" % rel)
            if not gz:
                old_doc, new_doc = json.loads(old), json.loads(data)
                for key in ("cases", "decodes"):
                    for a, b in zip(old_doc[key], new_doc[key]):
                        if a != b:
                            print("  committed:", json.dumps(a, ensure_ascii=False)[:300])
                            print("  now:      ", json.dumps(b, ensure_ascii=False)[:300])
                            break
        else:
            print("same    %s" % rel)
    if args.check:
        print("check: %s" % ("FAILED (%d files differ)" % failures if failures else "all same"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
