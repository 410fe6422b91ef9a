#!/usr/bin/env python3
"""Builds the TokenButler predictor fixtures under tests/fixtures/tokenbutler/ (random weights,
seeded): predictor-v1/ and predictor-hf/ for the base model tests/fixtures/llama-gqa-f32, and
butler-bf16/, a tiny llama_butler folder. Each holds reference.json with the predicted logits
[layer][head][query t][key j <= t] of a full-sequence forward (see tests/fixtures/tokenbutler/README.md).

    python3 tools/make_predictor_fixtures.py --out tests/fixtures/tokenbutler
"""

import argparse
import json
import os
import platform
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_butler_checkpoint as mbc  # noqa: E402
import tokenbutler as tb  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join("tests", "fixtures", "llama-gqa-f32")
TOKENS = 32
NOTES = ("layer-0 input: transformers on the CPU in F32 (layer 0's input_layernorm of the "
         "embeddings{extra}); predicted: q_imp.k_imp/sqrt(dDash) from ONE full-sequence forward of "
         "the predictor in float64 (F32 weights widened exactly, the F32 layer-0 input widened, "
         "RoPE angles and llama3-scaled inverse frequencies in float64); rows t, keys j <= t; "
         "values rounded to 9 significant digits.")


def sig9(values):
    return [float(f"{v:.9g}") for v in values]


@torch.no_grad()
def reference(model, predictor, tokens, extra_note=""):
    ids = torch.tensor([tokens])
    hidden = tb.layer_hidden_states(model, ids)
    x0 = tb.layer0_input(model, hidden)  # F32
    q, k = predictor.double()(x0.double())
    logits = tb.predicted_logits(q, k)[0]  # [N, H, L, L]
    predictor.float()
    layers = list(range(1, predictor.layers))
    predicted = [[[sig9(logits[l, h, t, :t + 1].tolist()) for t in range(len(tokens))]
                  for h in range(predictor.heads)] for l in layers]
    return {"variant": predictor.variant, "tokens": tokens, "layers": layers,
            "heads": predictor.heads, "predicted": predicted,
            "layer0_input_first_row": sig9(x0[0, 0].tolist()),
            "layer0_input_last_row": sig9(x0[0, -1].tolist()),
            "notes": NOTES.format(extra=extra_note),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": __import__("transformers").__version__}}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")


def predictor_fixture(out, variant, seed):
    base_dir = os.path.join(ROOT, BASE)
    with open(os.path.join(base_dir, "reference.json")) as f:
        tokens = json.load(f)["tokens"][:TOKENS]
    folder = os.path.join(out, f"predictor-{variant}")
    os.makedirs(folder, exist_ok=True)
    info = tb.base_model_info(base_dir)
    info["path"] = BASE
    predictor = mbc.write_random_predictor(base_dir, folder, variant, dDash=8, intdim=32,
                                           attn_reduce_factor=2, seed=seed, base_info=info)
    with open(os.path.join(folder, "predictor.json")) as f:
        doc = json.load(f)
    doc["training"]["tool"] = "tools/make_predictor_fixtures.py"
    tb._write_json_atomic(os.path.join(folder, "predictor.json"), doc)
    loaded = tb.load_predictor(folder)  # check the files round-trip
    for name, t in predictor.state_dict().items():
        assert torch.equal(t, loaded.state_dict()[name]), name
    model = tb.load_base_model(base_dir)
    write_json(os.path.join(folder, "reference.json"), reference(model, loaded, tokens))
    print(f"{folder}: {doc['parameters']} parameters")


def butler_fixture(out, seed):
    folder = os.path.join(out, "butler-bf16")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    config, predictor = mbc.make_butler(folder, sizes="tiny", dtype=torch.bfloat16, variant="hf",
                                        seed=seed, std=0.1)
    g = torch.Generator().manual_seed(seed + 7)
    tokens = [config["bos_token_id"]] + torch.randint(0, config["vocab_size"], (TOKENS - 1,),
                                                      generator=g).tolist()
    model = tb.load_base_model(folder)  # BF16 weights upcast: model.float()
    ref = reference(model, predictor, tokens, extra_note=", the BF16 weights upcast with "
                    "model.float()")
    with torch.no_grad():
        ref["last_logits"] = sig9(model(torch.tensor([tokens])).logits[0, -1].tolist())
    ref["notes"] += (" last_logits: the model's next-token logits at the last position, F32 "
                     "(model.float()).")
    write_json(os.path.join(folder, "reference.json"), ref)
    print(f"{folder}: hidden {config['hidden_size']}, {config['num_hidden_layers']} layers")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tokenbutler"))
    args = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    predictor_fixture(args.out, "v1", seed=11)
    predictor_fixture(args.out, "hf", seed=12)
    butler_fixture(args.out, seed=13)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print(f"{args.out}: {total} bytes")


if __name__ == "__main__":
    main()
