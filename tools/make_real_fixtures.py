#!/usr/bin/env python3
"""Reference fixtures for the real-model tests (tests/real/): SmolLM2-135M-Instruct as fetched by
tools/get_model.sh (a Q4_1 GGUF), loaded by transformers from the GGUF file itself.

transformers' GGUF loading dequantizes every tensor with gguf-py and undoes the q/k row
permutation of llama.cpp's converter; the model is saved as an F32 Hugging Face folder in the
model cache (not committed: 540 MB) and reloaded from there, and the references are computed from
the reloaded folder (the script checks that it gives the GGUF-loaded model's logits exactly).
Written to --out (tests/fixtures/real_smollm2/reference.json, a few tens of KB):

  prompts[i].ids            the prompt's token ids (transformers' tokenizer, no special tokens;
                            model input only: the tokenizer itself is checked elsewhere, and the
                            texts are chosen without digits, where transformers' GGUF tokenizer
                            and llama.cpp's differ)
  prompts[i].argmax         per-position argmax, with .margin (top-1 minus top-2 logit)
  prompts[i].top1 / .lse    per-position top-1 logit and log-sum-exp over the vocabulary
  prompts[i].last           the last position: top 50 ids and logits; mean, std, min, max and
                            log-sum-exp over the full vocabulary
  prompts[i].greedy         32 greedy tokens (a loop of full forward passes, no EOS stop), with
                            each step's margin
  logit_scale               max(1, max |logit|) over every prompt and position
  versions                  torch, transformers, gguf, numpy; the GGUF's sha256

--hf-only saves the folder and stops (what packaging/bootstrap.sh --test runs for the tests).
Runs on the CPU in a few minutes:

    python3 tools/make_real_fixtures.py --gguf "$(tools/get_model.sh smollm2)" \\
        --out tests/fixtures/real_smollm2

with a Python that has torch, transformers (5.x) and gguf installed.
"""

import argparse
import copy
import hashlib
import json
import os
import re
import sys
from pathlib import Path

GREEDY_TOKENS = 32
PROMPT_TOKENS = 64
TOP_K = 50


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digit_free_passages(shared: Path):
    """(source, text) pairs: the first passage of each corpus file with 400+ characters and no
    digit, so that the token ids do not depend on the pre-tokenizer's digit split."""
    def first(paragraphs):
        for p in paragraphs:
            p = " ".join(p.split())
            if len(p) >= 400 and not re.search(r"[0-9]", p):
                return p
        raise SystemExit("no digit-free passage of 400+ characters")

    data = shared / "data"
    stories = (data / "corpus/tinystories-valid.txt").read_text(encoding="utf-8").split("\n\n")
    wiki = (data / "eval/wikitext2-test.txt").read_text(encoding="utf-8").split("\n")
    c4 = [json.loads(line)["text"]
          for line in (data / "corpus/c4-realnewslike-sample.jsonl").open(encoding="utf-8")]
    book = (data / "corpus/gutenberg-00.txt").read_text(encoding="utf-8").split("\n\n")
    return [("corpus/tinystories-valid.txt", first(stories)),
            ("eval/wikitext2-test.txt", first(wiki)),
            ("corpus/c4-realnewslike-sample.jsonl", first(c4)),
            ("corpus/gutenberg-00.txt", first(book[200:]))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", required=True, type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--hf-dir", type=Path,
                        help="where to save the F32 Hugging Face folder (default: beside the "
                             "GGUF, <name>-f32-hf)")
    parser.add_argument("--out", type=Path, help="fixture folder (required without --hf-only)")
    parser.add_argument("--hf-only", action="store_true",
                        help="only save the F32 folder (what the real tests load; "
                             "packaging/bootstrap.sh --test runs this)")
    parser.add_argument("--shared", type=Path,
                        default=Path(os.environ.get("KVLENS_SHARED_DIR",
                                                    Path(__file__).resolve().parents[1] / "../shared")))
    args = parser.parse_args()
    if not args.hf_only and args.out is None:
        parser.error("--out is required (or --hf-only)")

    import gguf
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gguf_path = args.gguf.resolve()
    hf_dir = args.hf_dir or gguf_path.with_name(gguf_path.stem + "-f32-hf")
    folder, name = str(gguf_path.parent), gguf_path.name

    print(f"loading {gguf_path} with transformers {transformers.__version__}", flush=True)
    from_gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # The GGUF-loaded model is marked quantized (its weights are already dequantized F32) and
    # refuses save_pretrained: its weights go into a plain model of the same configuration.
    config = copy.deepcopy(from_gguf.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(from_gguf.state_dict())
    plain.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer.save_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    print(f"saved and reloaded {hf_dir}", flush=True)
    if args.hf_only:
        return 0

    @torch.no_grad()
    def logits_of(m, ids):
        return m(torch.tensor([ids])).logits[0].double()

    prompts = []
    scale = 1.0
    for source, text in digit_free_passages(args.shared.resolve()):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:PROMPT_TOKENS]
        if len(ids) < PROMPT_TOKENS:
            raise SystemExit(f"{source}: only {len(ids)} tokens")
        logits = logits_of(model, ids)
        gap = (logits - logits_of(from_gguf, ids)).abs().max().item()
        if gap != 0.0:
            raise SystemExit(f"{source}: the saved folder's logits differ from the GGUF-loaded "
                             f"model's by {gap}")
        scale = max(scale, logits.abs().max().item())
        top2 = logits.topk(2, dim=-1)
        last = logits[-1]
        last_top = last.topk(TOP_K)
        greedy, margins, sequence = [], [], list(ids)
        for _ in range(GREEDY_TOKENS):
            step = logits_of(model, sequence)[-1].topk(2)
            greedy.append(int(step.indices[0]))
            margins.append(float(step.values[0] - step.values[1]))
            sequence.append(greedy[-1])
        prompts.append({
            "source": source,
            "text": tokenizer.decode(ids),
            "ids": ids,
            "argmax": top2.indices[:, 0].tolist(),
            "margin": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
            "top1": top2.values[:, 0].tolist(),
            "lse": torch.logsumexp(logits, dim=-1).tolist(),
            "last": {
                "top_ids": last_top.indices.tolist(),
                "top_logits": last_top.values.tolist(),
                "mean": last.mean().item(), "std": last.std(unbiased=False).item(),
                "min": last.min().item(), "max": last.max().item(),
                "lse": torch.logsumexp(last, dim=0).item(),
            },
            "greedy": greedy,
            "greedy_margin": margins,
            "greedy_text": tokenizer.decode(greedy),
        })
        print(f"{source}: {len(ids)} tokens, min argmax margin {min(prompts[-1]['margin']):.4f}, "
              f"min greedy margin {min(margins):.4f}: {prompts[-1]['greedy_text']!r}", flush=True)

    config = model.config
    reference = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "made_by": "tools/make_real_fixtures.py (CPU, F32, eager attention)",
        "gguf_sha256": sha256_of(gguf_path),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
                     "accelerate": _dist_version("accelerate"), "numpy": np.__version__, "python": sys.version.split()[0]},
        "config": {"architecture": config.architectures[0], "vocab_size": config.vocab_size,
                   "num_hidden_layers": config.num_hidden_layers,
                   "hidden_size": config.hidden_size,
                   "tie_word_embeddings": bool(config.tie_word_embeddings)},
        "logit_scale": scale,
        "prompts": prompts,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "reference.json", "w", encoding="utf-8") as f:
        json.dump(reference, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out / 'reference.json'} (logit scale {scale:.3f})")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


if __name__ == "__main__":
    sys.exit(main())
