#!/usr/bin/env python3
"""Writes synthetic TokenButler files for tests: a random predictor for a model folder, a Hugging
Face "-Butler" folder (model_type llama_butler), or a v1-style .pt checkpoint (a list holding one
state dict of layer 0's self_attn). Predictor shapes: see tools/tokenbutler.py.

  make_butler_checkpoint.py --random-predictor MODEL_DIR --out DIR [--variant v1|hf --dDash 16
      --intdim 512 --attn-reduce-factor 8 --seed 0]
  make_butler_checkpoint.py --butler --out DIR (--from-model MODEL_DIR | --sizes llama-3.2-1b|tiny)
      [--dtype bf16|f16|f32 --variant hf --hidden ... --seed 0]
  make_butler_checkpoint.py --v1-pt OUT.pt MODEL_DIR [--dDash --intdim --attn-reduce-factor --seed]

The llama_butler config.json is written in the transformers 4 layout (rope_theta at the top level,
rope_scaling beside it) as the released checkpoints are. transformers has no llama_butler type:
AutoConfig.from_pretrained rejects it (the releases ship their own code, trust_remote_code), while
LlamaConfig.from_json_file / LlamaConfig.from_dict load it (the extra TokenButler fields become
attributes) and LlamaConfig.from_pretrained loads it with a warning about the model type. The
model weights then load with LlamaForCausalLM.from_pretrained(folder, config=that config); the
predictor tensors are reported as unused. Weights are the model's in its dtype in the first shard,
the predictor (sparse_token_predictor.* and the unused sparse_head_predictor.*) in F32 in a second
shard, listed by model.safetensors.index.json.
"""

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SIZES = {
    "llama-3.2-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                         intermediate=8192, vocab=128256, max_position=131072, tied=True,
                         rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, bos=128000,
                         eos=128001, dDash=16, intdim=512, attn_reduce_factor=8),
    "tiny": dict(hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=128,
                 max_position=64, tied=False, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                 bos=1, eos=2, dDash=4, intdim=16, attn_reduce_factor=2),
}
BUTLER_FIELDS = dict(head_attn_reduce_factor=2, min_sparse_index=8, sliding_window=128,
                     token_sparse_method="fixed_50pc")


def random_predictor(hidden_size, heads, layers, attn_reduce_factor=8, dDash=16, intdim=512,
                     variant="hf", rope_theta=10000.0, seed=0):
    """The reference initialisation (Xavier-uniform Linears, zero biases) with LayerNorm weights
    and biases drawn near 1 and 0 so that tests exercise them."""
    torch.manual_seed(seed)
    module = tb.TokenButlerPredictor(hidden_size, heads, layers, attn_reduce_factor, dDash, intdim,
                                     variant, rope_theta)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.1 * torch.randn_like(m.weight))
                m.bias.copy_(0.1 * torch.randn_like(m.bias))
    return module.eval()


def predictor_for_model(model_dir, variant="hf", dDash=16, intdim=512, attn_reduce_factor=8,
                        seed=0):
    config = tb.read_config(model_dir)
    return random_predictor(config["hidden_size"], config["num_attention_heads"],
                            config["num_hidden_layers"], attn_reduce_factor, dDash, intdim,
                            variant, tb.config_rope_theta(config), seed)


def write_random_predictor(model_dir, out_dir, variant="hf", dDash=16, intdim=512,
                           attn_reduce_factor=8, seed=0, base_info=None):
    module = predictor_for_model(model_dir, variant, dDash, intdim, attn_reduce_factor, seed)
    info = base_info if base_info is not None else tb.base_model_info(model_dir)
    tb.save_predictor(module, out_dir, info, {"tool": "tools/make_butler_checkpoint.py",
                                              "random": True, "seed": seed})
    return module


def head_predictor_state(hidden, heads, layers, reduce_factor, generator):
    """Tensors shaped like the reference's (unused) head-importance predictor."""
    r = hidden // reduce_factor

    def t(*shape):
        return torch.randn(*shape, generator=generator) * 0.02
    return {"input_proj.weight": t(r, hidden), "q_proj_attn.weight": t(r, r),
            "k_proj_attn.weight": t(r, r), "v_proj_attn.weight": t(r, r),
            "norm1.weight": torch.ones(r), "norm1.bias": torch.zeros(r),
            "norm2.weight": torch.ones(hidden), "norm2.bias": torch.zeros(hidden),
            "ffn.0.weight": t(4 * r, r), "ffn.0.bias": torch.zeros(4 * r),
            "ffn.2.weight": t(heads * layers, 4 * r), "ffn.2.bias": torch.zeros(heads * layers)}


def random_llama_state(s, dtype, seed, std=0.02):
    """Llama weights at sizes `s` (a SIZES entry): normal(0, std) matrices, norms near 1."""
    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    E, hd = s["hidden"], s["head_dim"]
    state = {"model.embed_tokens.weight": mat(s["vocab"], E)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = mat(s["heads"] * hd, E)
        state[p + "self_attn.k_proj.weight"] = mat(s["kv_heads"] * hd, E)
        state[p + "self_attn.v_proj.weight"] = mat(s["kv_heads"] * hd, E)
        state[p + "self_attn.o_proj.weight"] = mat(E, s["heads"] * hd)
        state[p + "mlp.gate_proj.weight"] = mat(s["intermediate"], E)
        state[p + "mlp.up_proj.weight"] = mat(s["intermediate"], E)
        state[p + "mlp.down_proj.weight"] = mat(E, s["intermediate"])
        state[p + "input_layernorm.weight"] = norm(E)
        state[p + "post_attention_layernorm.weight"] = norm(E)
    state["model.norm.weight"] = norm(E)
    if not s["tied"]:
        state["lm_head.weight"] = mat(s["vocab"], E)
    return state


def llama_config(s, dtype):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
            "vocab_size": s["vocab"], "max_position_embeddings": s["max_position"],
            "rms_norm_eps": 1e-5, "rope_theta": s["rope_theta"],
            "rope_scaling": dict(s["rope_scaling"]) if s["rope_scaling"] else None,
            "tie_word_embeddings": s["tied"], "bos_token_id": s["bos"], "eos_token_id": s["eos"],
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
            "torch_dtype": DTYPE_NAMES[dtype]}


def legacy_rope_layout(config):
    """transformers 5's rope_parameters -> the 4.x rope_theta + rope_scaling the releases use."""
    config = dict(config)
    params = config.pop("rope_parameters", None)
    if isinstance(params, dict):
        params = dict(params)
        config["rope_theta"] = params.pop("rope_theta", config.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default"))
        config["rope_scaling"] = None if kind == "default" else params
    return config


def read_model_state(model_dir):
    from safetensors import safe_open
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for name in files:
        with safe_open(os.path.join(model_dir, name), framework="pt") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
    return state


def write_butler(out_dir, config, model_state, predictor, head_reduce_factor=2, seed=0):
    """A llama_butler folder: config.json, model shard (model dtype), predictor shard (F32),
    model.safetensors.index.json."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1)
    extra = {tb.BUTLER_PREFIX + k: v.detach().float().contiguous()
             for k, v in predictor.state_dict().items()}
    head = head_predictor_state(config["hidden_size"], config["num_attention_heads"],
                                config["num_hidden_layers"], head_reduce_factor, g)
    extra.update({"model.layers.0.self_attn.sparse_head_predictor." + k: v for k, v in head.items()})
    shards = {"model-00001-of-00002.safetensors": {k: v.contiguous() for k, v in model_state.items()},
              "model-00002-of-00002.safetensors": extra}
    weight_map, total = {}, 0
    for name, tensors in shards.items():
        save_file(tensors, os.path.join(out_dir, name), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, name), 0o644)
        for key, t in tensors.items():
            weight_map[key] = name
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
        f.write("\n")
    config = legacy_rope_layout(config)
    config.update(model_type="llama_butler", architectures=["LlamaButlerForCausalLM"],
                  dDash=predictor.dDash, intdim=predictor.intdim,
                  attn_reduce_factor=predictor.attn_reduce_factor,
                  head_attn_reduce_factor=head_reduce_factor,
                  producer_frequency=config["num_hidden_layers"],
                  **{k: v for k, v in BUTLER_FIELDS.items() if k != "head_attn_reduce_factor"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config.get("bos_token_id"),
                   "eos_token_id": config.get("eos_token_id"), "do_sample": False}, f, indent=2)
        f.write("\n")
    return config


def make_butler(out_dir, sizes=None, from_model=None, dtype=None, variant="hf", seed=0,
                overrides=None, std=0.02):
    """From a model folder (its weights, dtype unless given, tokenizer files copied) or from random
    weights at `sizes` (a SIZES key) with `overrides` of its fields."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if from_model:
        config = tb.read_config(from_model)
        state = read_model_state(from_model)
        if dtype is not None:
            state = {k: v.to(dtype) for k, v in state.items()}
            config["torch_dtype"] = DTYPE_NAMES[dtype]
            if "dtype" in config:
                config["dtype"] = DTYPE_NAMES[dtype]
        dDash = overrides.get("dDash", 16)
        intdim = overrides.get("intdim", 512)
        reduce = overrides.get("attn_reduce_factor", 8)
    else:
        s = dict(SIZES[sizes])
        s.update(overrides)
        dtype = dtype or torch.bfloat16
        config = llama_config(s, dtype)
        state = random_llama_state(s, dtype, seed, std)
        dDash, intdim, reduce = s["dDash"], s["intdim"], s["attn_reduce_factor"]
    predictor = random_predictor(config["hidden_size"], config["num_attention_heads"],
                                 config["num_hidden_layers"], reduce, dDash, intdim, variant,
                                 tb.config_rope_theta(config), seed)
    config = write_butler(out_dir, config, state, predictor, seed=seed)
    if from_model:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(from_model, name)):
                shutil.copy(os.path.join(from_model, name), os.path.join(out_dir, name))
    return config, predictor


def write_v1_pt(out_path, model_dir, dDash=16, intdim=512, attn_reduce_factor=8, seed=0):
    """torch.save([state dict of layer 0's self_attn]) as the v1 code saves it: the layer's own
    q/k/v/o_proj weights (random), sparse_token_predictor.* (a random v1 predictor) and the unused
    sparse_head_predictor.*."""
    config = tb.read_config(model_dir)
    E, H = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads", H)
    hd = config.get("head_dim") or E // H
    predictor = predictor_for_model(model_dir, "v1", dDash, intdim, attn_reduce_factor, seed)
    g = torch.Generator().manual_seed(seed + 1)
    state = {"q_proj.weight": torch.randn(H * hd, E, generator=g) * 0.02,
             "k_proj.weight": torch.randn(kv * hd, E, generator=g) * 0.02,
             "v_proj.weight": torch.randn(kv * hd, E, generator=g) * 0.02,
             "o_proj.weight": torch.randn(E, H * hd, generator=g) * 0.02}
    state.update({"sparse_token_predictor." + k: v.detach().clone()
                  for k, v in predictor.state_dict().items()})
    head = head_predictor_state(E, H, config["num_hidden_layers"], 2, g)
    state.update({"sparse_head_predictor." + k: v for k, v in head.items()})
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    torch.save([state], out_path)
    return predictor


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--random-predictor", metavar="MODEL_DIR")
    mode.add_argument("--butler", action="store_true")
    mode.add_argument("--v1-pt", nargs=2, metavar=("OUT_PT", "MODEL_DIR"))
    p.add_argument("--out")
    p.add_argument("--variant", choices=tb.VARIANTS, default="hf")
    p.add_argument("--dDash", type=int)
    p.add_argument("--intdim", type=int)
    p.add_argument("--attn-reduce-factor", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-model", help="--butler: take the model's weights from this folder")
    p.add_argument("--sizes", choices=sorted(SIZES), help="--butler: random weights at these sizes")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="--butler: model weights' dtype")
    p.add_argument("--std", type=float, default=0.02, help="--butler: random weights' std")
    for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
                 "max_position"):
        p.add_argument("--" + name.replace("_", "-"), type=int, help="--butler --sizes override")
    args = p.parse_args(argv)
    sizes = {"dDash": args.dDash, "intdim": args.intdim,
             "attn_reduce_factor": args.attn_reduce_factor}
    defaults = {"dDash": 16, "intdim": 512, "attn_reduce_factor": 8}
    chosen = {k: v if v is not None else defaults[k] for k, v in sizes.items()}
    if args.random_predictor:
        if not args.out:
            p.error("--random-predictor needs --out")
        write_random_predictor(args.random_predictor, args.out, args.variant, seed=args.seed,
                               **chosen)
        print(f"wrote {args.out}/predictor.safetensors and predictor.json")
    elif args.v1_pt:
        write_v1_pt(args.v1_pt[0], args.v1_pt[1], seed=args.seed, **chosen)
        print(f"wrote {args.v1_pt[0]}")
    else:
        if not args.out or bool(args.from_model) == bool(args.sizes):
            p.error("--butler needs --out and one of --from-model or --sizes")
        overrides = dict(sizes)
        overrides.update({k: getattr(args, k) for k in ("hidden", "layers", "heads", "kv_heads",
                                                         "head_dim", "intermediate", "vocab",
                                                         "max_position")})
        make_butler(args.out, args.sizes, args.from_model,
                    DTYPES[args.dtype] if args.dtype else None, args.variant, args.seed,
                    overrides, args.std)
        print(f"wrote the llama_butler folder {args.out}")


if __name__ == "__main__":
    main()
