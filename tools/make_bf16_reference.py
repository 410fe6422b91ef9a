#!/usr/bin/env python3
"""BF16 reference of a checkpoint from Hugging Face transformers, for kvlens' BF16 path (issue 26
item 5): greedy continuations and the top logits of every step, computed in BF16 (weights,
activations and KV cache, as transformers runs a model loaded with dtype=torch.bfloat16), and the
same steps recomputed in F32 from the same weights (model.float()) so that a test can tell how far
BF16 rounding alone moves the logits.

Written per prompt: the prompt's ids, `greedy_bf16` and `greedy_f32` (max_new tokens each, no
stop at EOS), and for every step of the BF16 continuation the `top` ids of the BF16 logits with
their BF16 logits and the F32 logits at those ids (the F32 run teacher-forced on the BF16
continuation, so both rows belong to the same context), plus the BF16 top-1/top-2 margin. Eager
attention; the decode uses transformers' own KV cache, one token per forward, as a user's
generate() does.

Usage (the GPU machine; it also runs on the CPU, where BF16 matmuls may round differently):
    python3 tools/make_bf16_reference.py --model assets/models/demo \\
        --out tests/fixtures/demo_bf16_reference.json
"""
import argparse
import json
import platform
import sys

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

PROMPTS = [
    "It was a dark and stormy night, and",
    "Once upon a time there was a little girl who loved the sea. Every morning she",
    "The old map showed a valley where the vineyards climb up terraces. The place is called",
]


def decode_steps(model, prompt_ids, max_new, device, forced=None):
    """Greedy decode (or teacher-forced on `forced`): per step the logits row as F32."""
    ids = torch.tensor([prompt_ids], device=device)
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    rows, chosen = [], []
    logits = out.logits[0, -1]
    for step in range(max_new):
        rows.append(logits.float().cpu())
        token = int(torch.argmax(logits)) if forced is None else forced[step]
        chosen.append(token)
        if step + 1 == max_new:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values
        logits = out.logits[0, -1]
    return chosen, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--top", type=int, default=32, help="logits kept per step")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    torch.manual_seed(0)
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    bos = json.load(open(f"{args.model}/config.json")).get("bos_token_id")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 attn_implementation="eager").to(args.device)
    model.eval()
    stored = {p.dtype for p in model.parameters()}
    print(f"parameters in {stored}", file=sys.stderr)

    prompts = args.prompt or PROMPTS
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tok.encode(prompt, add_special_tokens=False).ids
            if bos is not None:
                ids = [bos] + ids
            greedy_bf16, rows_bf16 = decode_steps(model, ids, args.max_new, args.device)
            results.append({"prompt": prompt, "prompt_tokens": ids, "greedy_bf16": greedy_bf16,
                            "rows": rows_bf16})
        model.float()
        for r in results:
            greedy_f32, _ = decode_steps(model, r["prompt_tokens"], args.max_new, args.device)
            _, rows_f32 = decode_steps(model, r["prompt_tokens"], args.max_new, args.device,
                                       forced=r["greedy_bf16"])
            steps, worst_gap = [], 0.0
            for b, f in zip(r.pop("rows"), rows_f32):
                top = torch.topk(b, args.top)
                two = torch.topk(b, 2).values
                gap = float((b[top.indices] - f[top.indices]).abs().max())
                worst_gap = max(worst_gap, gap)
                steps.append({"top_ids": top.indices.tolist(),
                              "bf16": [round(float(v), 6) for v in top.values],
                              "f32": [round(float(f[i]), 6) for i in top.indices],
                              "margin_bf16": round(float(two[0] - two[1]), 6)})
            r["greedy_f32"] = greedy_f32
            r["steps"] = steps
            r["max_top_gap_bf16_vs_f32"] = worst_gap
            first_diff = next((i for i, (a, b) in enumerate(zip(r["greedy_bf16"], greedy_f32))
                               if a != b), None)
            r["first_bf16_f32_difference"] = first_diff
            print(f"{r['prompt'][:40]!r}: |bf16 - f32| at the top ids <= {worst_gap:.4f}; "
                  f"greedy bf16 vs f32 first differs at {first_diff}; smallest bf16 margin "
                  f"{min(s['margin_bf16'] for s in steps):.4f}", file=sys.stderr)

    ref = {"model": args.model, "made_by": "tools/make_bf16_reference.py",
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__},
           "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
           "dtype": "bfloat16", "attention": "eager", "max_new": args.max_new,
           "prompts": results}
    with open(args.out, "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
