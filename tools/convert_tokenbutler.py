#!/usr/bin/env python3
"""Converts a published TokenButler predictor into kvlens' predictor.safetensors + predictor.json
(engine/model/predictor.h): a v1 `.pt` checkpoint (torch.save of a list holding one state dict of
layer 0's self_attn, predictor keys `sparse_token_predictor.<module>.weight|bias`), or the predictor
inside a Hugging Face llama_butler folder (keys under
model.layers.0.self_attn.sparse_token_predictor.). Sizes come from the tensor shapes and the base
model's config; the variant is hf when norm_importance.* is present, else v1. Output tensors F32.

  convert_tokenbutler.py CHECKPOINT.pt --model MODEL_DIR --out DIR
  convert_tokenbutler.py BUTLER_DIR [--model MODEL_DIR] --out DIR
"""

import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenbutler as tb  # noqa: E402

V1_PREFIX = "sparse_token_predictor."
REQUIRED = ["input_proj.weight", "q_proj_attn.weight", "k_proj_attn.weight", "v_proj_attn.weight",
            "norm1.weight", "norm1.bias", "ffn.0.weight", "ffn.0.bias", "ffn.2.weight",
            "ffn.2.bias", "norm2.weight", "norm2.bias", "q_proj_importance.0.weight",
            "q_proj_importance.2.weight", "k_proj_importance.0.weight",
            "k_proj_importance.2.weight"]
HF_ONLY = ["norm_importance.weight", "norm_importance.bias"]


class ConversionError(Exception):
    pass


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_predictor(state, source, prefix, model_config, declared=None):
    """state: predictor tensors without prefix -> TokenButlerPredictor with those weights.
    Errors name `source` and the full key (prefix + name). `declared`: sizes a config states
    (dDash, intdim, attn_reduce_factor) that must agree with the shapes."""
    for name in REQUIRED:
        if name not in state:
            raise ConversionError(f"{source}: missing tensor {prefix}{name}")
    has_norm = [name in state for name in HF_ONLY]
    if any(has_norm) and not all(has_norm):
        missing = HF_ONLY[has_norm.index(False)]
        raise ConversionError(f"{source}: missing tensor {prefix}{missing} "
                              f"(norm_importance needs a weight and a bias)")
    variant = "hf" if all(has_norm) else "v1"
    for name in REQUIRED + HF_ONLY:
        if name in state and not torch.is_floating_point(state[name]):
            raise ConversionError(f"{source}: {prefix}{name} is {state[name].dtype}, "
                                  "expected a floating-point tensor")
    E = model_config["hidden_size"]
    H = model_config["num_attention_heads"]
    N = model_config["num_hidden_layers"]
    shape = tuple(state["input_proj.weight"].shape)
    if len(shape) != 2 or shape[1] != E or shape[0] == 0 or E % shape[0]:
        raise ConversionError(f"{source}: {prefix}input_proj.weight has shape {list(shape)}, "
                              f"expected [E/r, E] with E = {E} (the model's hidden size)")
    reduce = E // shape[0]
    m_shape = tuple(state["q_proj_importance.0.weight"].shape)
    if len(m_shape) != 2:
        raise ConversionError(f"{source}: {prefix}q_proj_importance.0.weight has shape "
                              f"{list(m_shape)}, expected [intdim, {E}]")
    intdim = m_shape[0]
    s_shape = tuple(state["q_proj_importance.2.weight"].shape)
    if len(s_shape) != 2 or s_shape[0] % (N * H) or s_shape[0] == 0:
        raise ConversionError(f"{source}: {prefix}q_proj_importance.2.weight has shape "
                              f"{list(s_shape)}, expected [N*H*dDash, intdim] with N*H = {N}*{H}")
    dDash = s_shape[0] // (N * H)
    inferred = {"dDash": dDash, "intdim": intdim, "attn_reduce_factor": reduce}
    for key, value in (declared or {}).items():
        if value is not None and value != inferred[key]:
            raise ConversionError(f"{source}: config says {key} = {value}, the tensors under "
                                  f"{prefix} give {inferred[key]}")
    try:
        module = tb.TokenButlerPredictor(E, H, N, reduce, dDash, intdim, variant,
                                         tb.config_rope_theta(model_config))
    except ValueError as error:
        raise ConversionError(f"{source}: sizes {inferred} do not make a predictor: {error}")
    expected = module.state_dict()
    for name, want in expected.items():
        got = tuple(state[name].shape)
        if got != tuple(want.shape):
            raise ConversionError(f"{source}: {prefix}{name} has shape {list(got)}, expected "
                                  f"{list(want.shape)} (E={E}, heads={H}, layers={N}, "
                                  f"r={reduce}, dDash={dDash}, intdim={intdim}, {variant})")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        print(f"warning: {source}: ignoring unknown tensors {[prefix + k for k in unknown]}",
              file=sys.stderr)
    module.load_state_dict({k: state[k].float() for k in expected})
    return module.eval()


def load_v1_pt(path, unsafe=False):
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not unsafe)
    except Exception as error:  # noqa: BLE001 - report what torch says
        hint = "" if unsafe else " (if you trust the file, retry with --unsafe-load)"
        raise ConversionError(f"{path}: cannot be read by torch.load: {error}{hint}")
    if isinstance(obj, (list, tuple)):
        if len(obj) != 1 or not isinstance(obj[0], dict):
            raise ConversionError(f"{path}: expected a list holding one state dict, got a "
                                  f"{type(obj).__name__} of {len(obj)} items")
        obj = obj[0]
    if not isinstance(obj, dict):
        raise ConversionError(f"{path}: expected a list holding one state dict, got "
                              f"{type(obj).__name__}")
    state = {k[len(V1_PREFIX):]: v for k, v in obj.items()
             if isinstance(k, str) and k.startswith(V1_PREFIX)}
    if not state:
        raise ConversionError(f"{path}: no tensors under {V1_PREFIX} (keys: "
                              f"{sorted(obj)[:8]}...)")
    return state


def convert_v1_pt(pt_path, model_dir, out_dir, unsafe=False):
    config = tb.read_config(model_dir)
    state = load_v1_pt(pt_path, unsafe)
    module = build_predictor(state, pt_path, V1_PREFIX, config)
    training = {"tool": "tools/convert_tokenbutler.py", "converted_from": os.path.abspath(pt_path),
                "source_format": "v1 .pt (torch.save of [layer-0 self_attn state dict])",
                "sha256": sha256(pt_path)}
    return tb.save_predictor(module, out_dir, tb.base_model_info(model_dir, config), training)


def butler_files(butler_dir):
    index = os.path.join(butler_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        return {k: os.path.join(butler_dir, v) for k, v in weight_map.items()}
    single = os.path.join(butler_dir, "model.safetensors")
    if not os.path.exists(single):
        raise ConversionError(f"{butler_dir}: neither model.safetensors.index.json nor "
                              "model.safetensors")
    from safetensors import safe_open
    with safe_open(single, framework="pt") as f:
        return {k: single for k in f.keys()}


def load_butler_state(butler_dir):
    from safetensors import safe_open
    files = butler_files(butler_dir)
    state, sources = {}, set()
    for key, path in files.items():
        if key.startswith(tb.BUTLER_PREFIX):
            if not os.path.exists(path):
                raise ConversionError(f"{path}: missing (listed for {key})")
            with safe_open(path, framework="pt") as f:
                if key not in f.keys():
                    raise ConversionError(f"{path}: has no tensor {key} (the index lists it)")
                state[key[len(tb.BUTLER_PREFIX):]] = f.get_tensor(key)
            sources.add(path)
    if not state:
        raise ConversionError(f"{butler_dir}: no tensors under {tb.BUTLER_PREFIX}")
    return state, sorted(sources)


def extract_butler(butler_dir, out_dir, model_dir=None):
    butler_config = tb.read_config(butler_dir)
    config = tb.read_config(model_dir) if model_dir else butler_config
    state, sources = load_butler_state(butler_dir)
    declared = {k: butler_config.get(k) for k in ("dDash", "intdim", "attn_reduce_factor")}
    source = sources[0] if len(sources) == 1 else butler_dir
    module = build_predictor(state, source, tb.BUTLER_PREFIX, config, declared)
    training = {"tool": "tools/convert_tokenbutler.py",
                "converted_from": os.path.abspath(butler_dir),
                "source_format": "llama_butler folder",
                "files": {os.path.basename(p): sha256(p) for p in sources}}
    return tb.save_predictor(module, out_dir, tb.base_model_info(model_dir or butler_dir, config),
                             training)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a v1 .pt file or a llama_butler folder")
    p.add_argument("--model", help="the base model folder (default for a folder: the folder)")
    p.add_argument("--out", required=True)
    p.add_argument("--unsafe-load", action="store_true",
                   help="torch.load without weights_only (only for files you trust)")
    args = p.parse_args(argv)
    try:
        if os.path.isdir(args.source):
            info = extract_butler(args.source, args.out, args.model)
        else:
            if not args.model:
                p.error("a .pt file needs --model (the base model folder)")
            info = convert_v1_pt(args.source, args.model, args.out, args.unsafe_load)
    except (ConversionError, FileNotFoundError, KeyError) as error:
        sys.exit(f"convert_tokenbutler.py: {error}")
    print(f"wrote {args.out}: {info['variant']} predictor, {info['parameters']:,} parameters "
          f"(E={info['hidden_size']}, r={info['attn_reduce_factor']}, dDash={info['dDash']}, "
          f"intdim={info['intdim']})")


if __name__ == "__main__":
    main()
