"""Plain-text corpora as documents, shared by the training tools (train_demo_model.py,
train_predictor.py): a file's blank-line-separated blocks (paragraphs), grouped into documents of
at most about max_chars characters so a book's paragraphs stay together."""

import re


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
