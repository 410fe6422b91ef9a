"""Plain-text corpora as documents, shared by the training tools (train_demo_model.py,
train_predictor.py) and the results script: a .txt file's blank-line-separated blocks
(paragraphs), grouped into documents of at most about max_chars characters so a book's paragraphs
stay together, or a .jsonl file's "text" fields; and the held-out split train_predictor.py never
trains on (the trailing documents holding >= 2% of a file's characters).

Writes a file's held-out part as text (documents separated by a blank line), e.g. the C4 text
that tools/real_model_results.sh measures perplexity on:
    python3 tools/corpus_text.py --heldout ../shared/data/corpus/c4-realnewslike-sample.jsonl \
        --out c4-heldout.txt
Stdlib only.
"""

import argparse
import json
import re
import sys

# train_predictor.py's defaults: the split the held-out text must reproduce.
DEFAULT_HELDOUT_FRAC = 0.02
DEFAULT_DOC_CHARS = 8000


def split_blocks(text):
    """Blocks separated by blank lines (lines holding only whitespace count as blank), trailing
    spaces stripped, empty ones dropped."""
    blocks = re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n"))
    out = []
    for b in blocks:
        b = "\n".join(line.rstrip() for line in b.strip("\n").split("\n"))
        if b.strip():
            out.append(b)
    return out


def group_blocks(blocks, max_chars):
    """Join consecutive blocks into documents of at most ~max_chars characters."""
    docs, cur, n = [], [], 0
    for b in blocks:
        if cur and n + len(b) > max_chars:
            docs.append("\n\n".join(cur))
            cur, n = [], 0
        cur.append(b)
        n += len(b) + 2
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def read_documents(path, doc_chars):
    """A corpus file's documents: .jsonl one per line (field "text", stripped; empty ones
    dropped), anything else blank-line blocks grouped into documents of ~doc_chars characters."""
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            docs = []
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise SystemExit(f"{path}:{number}: expected an object with a \"text\" string")
                if obj["text"].strip():
                    docs.append(obj["text"].strip())
            return docs
        return group_blocks(split_blocks(f.read()), doc_chars)


def heldout_split(docs, frac):
    """(train, held out): held out = the trailing documents holding >= frac of the characters,
    never all of them."""
    need = frac * sum(len(d) for d in docs)
    size, k = 0, len(docs)
    while k > 1 and size < need:
        k -= 1
        size += len(docs[k])
    return docs[:k], docs[k:]


def main(argv=None):
    p = argparse.ArgumentParser(description="Write a corpus file's held-out part (the documents "
                                "train_predictor.py never trains on) as text.")
    p.add_argument("--heldout", required=True, metavar="FILE", help="a corpus file, .txt or .jsonl")
    p.add_argument("--out", required=True, help="the text file to write")
    p.add_argument("--heldout-frac", type=float, default=DEFAULT_HELDOUT_FRAC,
                   help="as train_predictor.py's --heldout-frac (default %(default)s)")
    p.add_argument("--doc-chars", type=int, default=DEFAULT_DOC_CHARS,
                   help="as train_predictor.py's --doc-chars (default %(default)s)")
    args = p.parse_args(argv)
    if not 0 < args.heldout_frac < 1:
        p.error(f"--heldout-frac: expected a fraction in (0, 1), got {args.heldout_frac}")
    try:
        docs = read_documents(args.heldout, args.doc_chars)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{args.heldout}: cannot be read as a corpus file ({e})")
    if len(docs) < 2:
        raise SystemExit(f"{args.heldout}: {len(docs)} document(s); a held-out part needs at "
                         "least 2")
    train, held = heldout_split(docs, args.heldout_frac)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(held) + "\n")
    print(f"{args.out}: the last {len(held)} of {len(docs)} documents of {args.heldout} "
          f"({sum(map(len, held))} characters)", file=sys.stderr)


if __name__ == "__main__":
    main()
