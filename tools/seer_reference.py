#!/usr/bin/env python3
"""Reference gate logits of the seerattention policy (docs/policies/seerattention.md) for
tests/unit/test_seer_policy.cpp: a model folder's trained gate (seer_gate.*) applied in PyTorch,
by train_seer_gate.py's SeerGate, to the model's own dense keys and queries (transformers, F32),
as kvlens's decode computes them one token at a time: at step t, block b's summaries are the key
max/min over its tokens <= t (the current block partial). Writes JSON
{"tokens", "block_size", "steps", "logits": [step][layer][kv_head][block]}.

    python3 tools/seer_reference.py --model assets/models/demo --out tests/fixtures/seer/reference.json
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402
import train_seer_gate as tsg  # noqa: E402

# The token ids of the C++ test (tests/unit/test_seer_policy.cpp: reference_tokens()).
TOKENS = [(i * 37 + 11) % 300 + 3 for i in range(72)]
STEPS = [5, 15, 16, 33, 47, 71]


def load_gate(model_dir):
    from safetensors.torch import load_file
    with open(os.path.join(model_dir, "seer_gate.json")) as f:
        info = json.load(f)
    gate = tsg.SeerGate(info["layers"], info["heads"], info["kv_heads"], info["head_dim"],
                        info["gate_dim"])
    tensors = load_file(os.path.join(model_dir, "seer_gate.safetensors"))
    with torch.no_grad():
        for l in range(info["layers"]):
            for name in ("q_proj", "k_max_proj", "k_min_proj", "q_norm", "k_norm"):
                getattr(gate, name)[l].copy_(tensors[f"layers.{l}.{name}.weight"])
    return gate, info


@torch.no_grad()
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    gate, info = load_gate(args.model)
    block = info["block_size"]
    model = tb.load_base_model(args.model)
    hidden = tb.layer_hidden_states(model, torch.tensor([TOKENS]))
    logits = []
    for t in STEPS:
        per_layer = []
        for layer in range(gate.layers):
            q, k = tsg.layer_qk(model, hidden, layer, gate.kv_heads)
            k = k[:, :, :t + 1]
            blocks = (t + block) // block
            kmax = torch.stack([k[:, :, b * block:(b + 1) * block].amax(2) for b in range(blocks)], 2)
            kmin = torch.stack([k[:, :, b * block:(b + 1) * block].amin(2) for b in range(blocks)], 2)
            a = gate.logits(layer, q[:, :, t:t + 1], kmax, kmin)  # [1, G, 1, blocks]
            per_layer.append(a[0, :, 0].tolist())
        logits.append(per_layer)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"tool": "tools/seer_reference.py", "tokens": TOKENS, "block_size": block,
                   "steps": STEPS, "logits": logits}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
