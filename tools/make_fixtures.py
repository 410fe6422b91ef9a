#!/usr/bin/env python3
"""Builds the Hugging Face parity fixtures under tests/fixtures/.

Each fixture is a tiny random-weight Llama-family checkpoint, written by transformers'
save_pretrained (config.json + safetensors), plus a reference.json holding what transformers
computes on it: per-position NLL, argmax, full logits rows, greedy continuation and the attention
probabilities of the last query row. tests/parity/test_parity_hf.cpp loads the checkpoints with
kvlens and compares.

The checkpoints differ exactly where Llama-family implementations tend to go wrong:

  llama-gqa-f32                      GQA (8 query heads over 2 KV heads), untied embeddings,
                                     default RoPE, F32.
  llama-mha-headdim-tied-llama3-f32  MHA with an explicit head_dim (24) != hidden / heads (16),
                                     tied embeddings (no lm_head.weight on disk), llama3 RoPE
                                     scaling whose three frequency bands are all populated, sharded
                                     safetensors with model.safetensors.index.json, F32.
  mistral-window-bf16                MistralForCausalLM with sliding_window 24 over 64 tokens,
                                     GQA, BF16 weights.
  llama-linear-f16                   linear RoPE scaling (factor 2), F16 weights.
  qwen2-bias-f32                     Qwen2ForCausalLM: biases on q, k and v (none on o_proj),
                                     GQA, rope_theta 1e6, F32.
  qwen3-qknorm-f32                   Qwen3ForCausalLM: per-head RMSNorm of q and k before RoPE,
                                     head_dim 32 != hidden / heads (16), tied embeddings, F32.
  phi3-fused-partial-f32             Phi3ForCausalLM: fused qkv_proj and gate_up_proj,
                                     partial_rotary_factor 0.75 (12 of 16 channels rotated), GQA,
                                     sliding_window 40 over 48 tokens, F32.
  phi3-longrope-f32                  Phi3ForCausalLM with longrope (Phi-3.5 / Phi-4-mini): short
                                     and long factors, original_max_position_embeddings 20 of 128
                                     (attention factor 1.27), partial rotary 0.75, 64 tokens, F32.
  llama-yarn-f32                     yarn RoPE (factor 4, original context 32, head_dim 32: the
                                     ramp has extrapolated, mixed and interpolated frequencies).
  llama-dynamic-f32                  dynamic NTK RoPE (factor 4) past max_position_embeddings 20,
                                     64 tokens, F32.
  gemma3-window-softcap-f32          Gemma3ForCausalLM (gemma3_text): two sliding-window layers
                                     (window 16 over 48 tokens, local RoPE base 1e4) and one
                                     global layer (base 1e6, linear scaling x2), q/k RMSNorm,
                                     (1 + weight) norms, pre/post feed-forward norms, GeGLU
                                     (gelu_pytorch_tanh), embeddings x sqrt(hidden),
                                     query_pre_attn_scalar 24 != head_dim 32, final logit
                                     soft-capping 3.0, tied embeddings, F32.

longrope and dynamic pick their RoPE table per forward call from the call's largest position
(transformers' dynamic_rope_update), so what a position computes depends on how the sequence was
split into calls. For them reference.json also holds "chunked": the same keys computed with a
KV cache in calls of 1 token (step by step) and of 7, and the greedy reference is a loop of
model() calls with a KV cache; the build fails if the calls do not change the result (nothing
exercised). Phi3's generate() differs from that loop past the longrope switch: it drops its
cache once there and recomputes every key with the long factors; its continuation is kept as
"generate_new".

For the BF16/F16 checkpoints reference.json holds the keys computed in the model's own dtype and,
under "reference_f32", the same keys after model.float() (weights widened exactly, F32 compute),
which is what the kvlens CPU engine computes.

Everything is seeded (weights, token sequences), and the references are computed from the
checkpoint as reloaded from disk, on the CPU, with the eager attention implementation.

Run it where PyTorch and transformers are installed (the GPU machine; it only needs the CPU):

    python3 tools/make_fixtures.py --out tests/fixtures

It prints a log of what it checked (saved tensors, config.json, attention sharpness and window,
F32-vs-F64 and native-vs-F32 gaps, greedy margins) and exits non-zero when a fixture would not
test what it claims (lost config keys, wrong dtype or sharding, untied/tied mix-ups).
"""

import argparse
import copy
import json
import math
import os
import platform
import shutil
import sys
import traceback

import torch
import transformers
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          Phi3Config, Qwen2Config, Qwen3Config)

TF_MAJOR = int(transformers.__version__.split(".")[0])

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

BOS, EOS = 1, 2
GREEDY_PROMPT = 12
GREEDY_NEW = 16

# Weight init. Projections use a seeded normal with std 0.1. q_proj and k_proj use 0.18 so that
# the pre-softmax attention logits have a standard deviation of about 2: the attention rows are
# then clearly non-uniform (a uniform row would hide mask, RoPE and GQA mapping bugs). Norm
# weights are 1 + N(0, 0.1) so a missing or misplaced norm weight changes the result.
STD = 0.1
STD_QK = 0.18
NORM_NOISE = 0.1

FIXTURES = [
    {
        "name": "llama-gqa-f32",
        "arch": "llama",
        "dtype": "float32",
        "seed": 1001,
        "seq_len": 64,
        "config": dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, tie_word_embeddings=False),
        "rope": {"rope_type": "default", "rope_theta": 10000.0},
    },
    {
        "name": "llama-mha-headdim-tied-llama3-f32",
        "arch": "llama",
        "dtype": "float32",
        "seed": 1002,
        "seq_len": 96,
        "config": dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True),
        # head_dim 24 gives 12 frequencies with wavelengths 2*pi*500000^(2i/24): 6.3, 18.7,
        # 55.7, 166, ... original_max_position_embeddings 32 puts the band edges at wavelengths
        # 32 / high_freq_factor = 8 and 32 / low_freq_factor = 32, so frequency 0 is kept,
        # frequency 1 is in the smoothed band and the rest are divided by the factor: every
        # branch of the llama3 formula is exercised, and 96 tokens rotate well past 32.
        "rope": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 32},
        "max_shard_size": "200KB",
    },
    {
        "name": "mistral-window-bf16",
        "arch": "mistral",
        "dtype": "bfloat16",
        "seed": 1003,
        "seq_len": 64,
        "config": dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=24),
        "rope": {"rope_type": "default", "rope_theta": 10000.0},
    },
    {
        "name": "llama-linear-f16",
        "arch": "llama",
        "dtype": "float16",
        "seed": 1004,
        "seq_len": 48,
        "config": dict(vocab_size=320, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),
        "rope": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    },
    {
        "name": "qwen2-bias-f32",
        "arch": "qwen2",
        "dtype": "float32",
        "seed": 1005,
        "seq_len": 48,
        "config": dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False),
        "rope": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    {
        "name": "qwen3-qknorm-f32",
        "arch": "qwen3",
        "dtype": "float32",
        "seed": 1006,
        "seq_len": 48,
        "config": dict(vocab_size=320, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention_bias=False, use_sliding_window=False),
        "rope": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    {
        "name": "phi3-fused-partial-f32",
        "arch": "phi3",
        "dtype": "float32",
        "seed": 1007,
        "seq_len": 48,
        "config": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       original_max_position_embeddings=128, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, sliding_window=40, partial_rotary_factor=0.75),
        "rope": {"rope_type": "default", "rope_theta": 10000.0},
    },
    {
        "name": "phi3-longrope-f32",
        "arch": "phi3",
        "dtype": "float32",
        "seed": 1008,
        "seq_len": 64,
        "config": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       original_max_position_embeddings=20, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, partial_rotary_factor=0.75),
        # 12 rotated channels: 6 factors each. The greedy continuation (12 + 16 tokens) and the
        # 64-token sequence both pass the original context of 20, so short and long factors are
        # both used when decoding step by step.
        "rope": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 2.6],
                 "long_factor": [1.1, 1.9, 3.4, 6.0, 10.5, 17.0]},
    },
    {
        "name": "llama-yarn-f32",
        "arch": "llama",
        "dtype": "float32",
        "seed": 1009,
        "seq_len": 64,
        "config": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False),
        # head_dim 32, base 1e4, original context 32: the correction range is [0, 3], so
        # frequency 0 is extrapolated, 1 and 2 mixed and 3..15 interpolated (divided by 4);
        # attention factor 0.1 ln 4 + 1.
        "rope": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                 "original_max_position_embeddings": 32},
    },
    {
        "name": "llama-dynamic-f32",
        "arch": "llama",
        "dtype": "float32",
        "seed": 1010,
        "seq_len": 64,
        "config": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=20,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),
        "rope": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    },
    {
        "name": "gemma3-window-softcap-f32",
        "arch": "gemma3_text",
        "dtype": "float32",
        "seed": 1011,
        "seq_len": 48,
        # Local, local, global: the 12-token greedy prompt plus 16 new tokens and the 48-token
        # sequence both pass the window of 16. The soft cap of 3 bends every logit row (their
        # uncapped scale is about 5), so a missing cap changes the argmax.
        "config": dict(vocab_size=320, hidden_size=64, intermediate_size=144, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       query_pre_attn_scalar=24, sliding_window=16,
                       layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                       final_logit_softcapping=3.0, attn_logit_softcapping=None,
                       hidden_activation="gelu_pytorch_tanh"),
        # Per layer type (transformers 5's rope_parameters; 4.x: rope_theta, rope_scaling and
        # rope_local_base_freq).
        "rope": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
        "rope_local": {"rope_type": "default", "rope_theta": 10000.0},
    },
]

CONFIG_CLASSES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config,
                  "qwen3": Qwen3Config, "phi3": Phi3Config, "gemma3_text": Gemma3TextConfig}
LENGTH_DEPENDENT_ROPE = ("longrope", "dynamic")
CHUNKS = (1, 7)  # call sizes of the "chunked" references (1: step by step)


def log(*args):
    print(*args, flush=True)


def r9(x):
    """Rounds to 9 significant digits (enough to round-trip a float32) to keep files small."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"non-finite value {x} in a reference")
    return float(f"{x:.9g}")


def rlist(t):
    return [r9(v) for v in t.reshape(-1).tolist()]


def make_config(spec):
    kwargs = dict(spec["config"])
    kwargs.update(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=None)
    rope = dict(spec["rope"])
    if "rope_local" in spec:  # gemma3: one RoPE per layer type
        local = dict(spec["rope_local"])
        if TF_MAJOR >= 5:
            kwargs["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
        else:
            kwargs["rope_theta"] = rope.pop("rope_theta")
            kwargs["rope_scaling"] = None if rope["rope_type"] == "default" else rope
            kwargs["rope_local_base_freq"] = local["rope_theta"]
        return CONFIG_CLASSES[spec["arch"]](**kwargs)
    if TF_MAJOR >= 5:
        # transformers 5 keeps rope_theta and the scaling inside one rope_parameters dict.
        kwargs["rope_parameters"] = rope
    else:
        kwargs["rope_theta"] = rope.pop("rope_theta")
        kwargs["rope_scaling"] = None if rope["rope_type"] == "default" else rope
    return CONFIG_CLASSES[spec["arch"]](**kwargs)


@torch.no_grad()
def init_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)
    # named_parameters() yields a tied tensor once, so tied embeddings get one draw.
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith(".bias"):  # projection biases (qwen2): small, of either sign
            p.copy_(STD * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:  # RMSNorm weights
            p.copy_(1.0 + NORM_NOISE * torch.randn(p.shape, generator=gen))
        elif name.endswith("qkv_proj.weight"):  # phi3: q rows, k rows, then v rows
            c = model.config
            head_dim = c.hidden_size // c.num_attention_heads
            qk_rows = (c.num_attention_heads + c.num_key_value_heads) * head_dim
            w = STD * torch.randn(p.shape, generator=gen)
            w[:qk_rows] *= STD_QK / STD
            p.copy_(w)
        else:
            is_qk = name.endswith("q_proj.weight") or name.endswith("k_proj.weight")
            std = STD_QK if is_qk else STD
            p.copy_(std * torch.randn(p.shape, generator=gen))


def load(path, dtype):
    key = "dtype" if TF_MAJOR >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                 **{key: dtype})
    model.eval()
    # Greedy references must not stop at (or suppress) EOS: the C++ side uses stop_at_eos=false.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@torch.no_grad()
def full_logits(model, ids):
    reset_rope_state(model)
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


def reset_rope_state(model):
    """Starts a fresh sequence for dynamic RoPE, whose rotary module keeps the longest length it
    has seen across calls (transformers resets it only on a call shorter than the original
    context); kvlens treats every session as a fresh sequence."""
    rotary = model.model.rotary_emb
    if hasattr(rotary, "original_inv_freq"):
        rotary.inv_freq = rotary.original_inv_freq.clone()
    if hasattr(rotary, "original_max_seq_len"):
        rotary.max_seq_len_cached = rotary.original_max_seq_len


def scored(wide, tokens, positions):
    """The per-position keys of a [T, vocab] float64 logits matrix."""
    T = len(tokens)
    logp = torch.log_softmax(wide, dim=-1)
    nll = -logp[torch.arange(T - 1), torch.tensor(tokens[1:])]
    top2 = torch.topk(wide, 2, dim=-1).values
    return {
        "nll": rlist(nll),
        "argmax": wide.argmax(dim=-1).tolist(),
        "argmax_margin": rlist(top2[:, 0] - top2[:, 1]),
        "last_logits": rlist(wide[T - 1]),
        "logits_rows": {"positions": positions, "values": [rlist(wide[p]) for p in positions]},
    }


@torch.no_grad()
def chunked_logits(model, tokens, chunk):
    """Logits [T, vocab] (float64) of the sequence fed in calls of `chunk` tokens with a KV cache,
    as kvlens's DecoderSession::forward does."""
    reset_rope_state(model)
    cache, rows = None, []
    for begin in range(0, len(tokens), chunk):
        out = model(input_ids=torch.tensor([tokens[begin:begin + chunk]]), past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0])
    return torch.cat(rows).double()


@torch.no_grad()
def cached_greedy(model, prompt, steps):
    """Greedy decoding with a KV cache (the prompt in one call, then one call per token), as
    generate() runs it; returns the tokens and the top-1/top-2 margins."""
    reset_rope_state(model)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens, margins = [], []
    for _ in range(steps):
        row = out.logits[0, -1].double()
        t2 = torch.topk(row, 2).values
        margins.append(r9(t2[0] - t2[1]))
        tokens.append(int(row.argmax()))
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values,
                    use_cache=True)
    return tokens, margins


@torch.no_grad()
def references(model, tokens, length_dependent=False, generate_recomputes=False):
    T = len(tokens)
    reset_rope_state(model)
    out = model(input_ids=torch.tensor([tokens]), use_cache=False, output_attentions=True)
    logits = out.logits[0]  # [T, vocab] in the model's dtype
    wide = logits.double()  # exact widening; the NLL is then taken in float64
    logp = torch.log_softmax(wide, dim=-1)
    nll = -logp[torch.arange(T - 1), torch.tensor(tokens[1:])]
    top2 = torch.topk(wide, 2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    argmax = wide.argmax(dim=-1)

    attn = out.attentions
    if attn is None or len(attn) != model.config.num_hidden_layers or attn[0] is None:
        raise RuntimeError("output_attentions returned no attention probabilities (not eager?)")
    last_rows = [[rlist(a[0, h, T - 1, :].double()) for h in range(a.shape[1])] for a in attn]

    positions = sorted({0, 7, T // 2, T - 1})
    prompt = tokens[:GREEDY_PROMPT]
    reset_rope_state(model)
    gen = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                         dtype=torch.long), do_sample=False, max_new_tokens=GREEDY_NEW,
                         eos_token_id=None, pad_token_id=0)
    greedy_new = gen[0, len(prompt):].tolist()
    if len(greedy_new) != GREEDY_NEW:
        raise RuntimeError(f"generate returned {len(greedy_new)} tokens, expected {GREEDY_NEW}")

    # Cross-check generate() (KV cache) against an uncached argmax loop, and record the
    # top-1/top-2 margin of every greedy choice: a near tie would make exact comparison unfair.
    # Length-dependent RoPE gives an uncached loop other tables than generate()'s calls, so
    # there the loop keeps a KV cache of its own.
    if length_dependent:
        manual, greedy_margin = cached_greedy(model, prompt, GREEDY_NEW)
    else:
        seq = list(prompt)
        manual, greedy_margin = [], []
        for _ in range(GREEDY_NEW):
            row = full_logits(model, seq)[-1].double()
            t2 = torch.topk(row, 2).values
            greedy_margin.append(r9(t2[0] - t2[1]))
            nxt = int(row.argmax())
            manual.append(nxt)
            seq.append(nxt)
    generate_new = None
    if generate_recomputes and manual != greedy_new:
        # Phi3ForCausalLM.prepare_inputs_for_generation drops the KV cache once, when the
        # sequence first passes original_max_position_embeddings, so generate() recomputes every
        # earlier key with the long factors; model() calls with a cache (and kvlens) keep them.
        # The reference is the cached loop; generate()'s own continuation is kept beside it.
        first = next(i for i, (a, b) in enumerate(zip(manual, greedy_new)) if a != b)
        if len(prompt) + first <= model.config.original_max_position_embeddings:
            raise RuntimeError(f"generate() {greedy_new} parts from the cached loop {manual} "
                               f"at step {first}, before the longrope switch")
        log(f"  note: generate() recomputes the cache at the longrope switch: {greedy_new}; "
            f"the cached loop (the reference): {manual}")
        generate_new, greedy_new = greedy_new, manual
    if manual != greedy_new:
        msg = f"generate() {greedy_new} != uncached greedy {manual}"
        # In F32 the cached and uncached paths differ by rounding only, so a disagreement away
        # from a near tie means generate() did something else (EOS handling, say).
        if model.dtype == torch.float32 and min(greedy_margin) > 1e-3:
            raise RuntimeError(msg)
        log(f"  note ({model.dtype}): {msg}; keeping generate()'s output")

    ref = {
        "tokens": list(tokens),
        "nll": rlist(nll),
        "argmax": argmax.tolist(),
        "argmax_margin": rlist(margin),
        "last_logits": rlist(wide[T - 1]),
        "logits_rows": {"positions": positions, "values": [rlist(wide[p]) for p in positions]},
        "greedy_prompt": prompt,
        "greedy_new": greedy_new,
        "greedy_margin": greedy_margin,
        "last_row_attention": last_rows,
    }
    if generate_new is not None:
        ref["generate_new"] = generate_new
    if length_dependent:
        ref["chunked"] = []
        for chunk in CHUNKS:
            entry = {"chunk": chunk}
            entry.update(scored(chunked_logits(model, tokens, chunk), tokens, positions))
            ref["chunked"].append(entry)
    return ref, wide, attn


def summarize_attention(attn, T, window):
    for layer, a in enumerate(attn):
        row = a[0, :, T - 1, :].double()  # [H, T]
        nonzero = (row > 0).sum(dim=-1).tolist()
        peaks = [round(v, 3) for v in row.max(-1).values.tolist()]
        log(f"  layer {layer}: last-row max prob per head {peaks}"
            f", nonzero keys {nonzero}")
        if window is not None and T > window and any(n != window for n in nonzero):
            # Not fatal: the parity test will then show the disagreement with kvlens.
            log(f"  WARNING: sliding window {window}: last row sees {nonzero} keys")


def describe_checkpoint(path):
    for fname in sorted(os.listdir(path)):
        log(f"  {fname}: {os.path.getsize(os.path.join(path, fname))} bytes")
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    log("  config.json: " + json.dumps(cfg, sort_keys=True))
    from safetensors import safe_open
    for fname in sorted(os.listdir(path)):
        if fname.endswith(".safetensors"):
            with safe_open(os.path.join(path, fname), framework="pt") as st:
                keys = sorted(st.keys())
                dts = sorted({str(st.get_slice(k).get_dtype()) for k in keys})
                log(f"  {fname}: {len(keys)} tensors, dtypes {dts}, lm_head present: "
                    f"{'lm_head.weight' in keys}")
    return cfg


def check_config(cfg, spec):
    # transformers 5 writes "dtype" and "rope_parameters"; 4.x wrote "torch_dtype",
    # "rope_theta" and "rope_scaling". kvlens accepts both; make sure one of them is right.
    declared = cfg.get("dtype", cfg.get("torch_dtype"))
    if declared != spec["dtype"]:
        raise RuntimeError(f"config.json declares dtype {declared!r}, expected {spec['dtype']!r}")
    if cfg.get("tie_word_embeddings", False) != spec["config"]["tie_word_embeddings"]:
        raise RuntimeError("config.json tie_word_embeddings differs from the spec")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if "full_attention" in rope:  # gemma3: the global layers' RoPE is checked
        if rope.get("sliding_attention", {}).get("rope_theta") != spec["rope_local"]["rope_theta"]:
            raise RuntimeError("config.json lost the sliding layers' rope_theta")
        rope = rope["full_attention"]
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta != spec["rope"]["rope_theta"]:
        raise RuntimeError(
            f"config.json rope_theta {theta!r}, expected {spec['rope']['rope_theta']}")
    want_type = spec["rope"]["rope_type"]
    got_type = rope.get("rope_type", rope.get("type", "default"))
    if got_type != want_type:
        raise RuntimeError(f"config.json rope type {got_type!r}, expected {want_type!r}")
    if spec["config"].get("head_dim") and cfg.get("head_dim") != spec["config"]["head_dim"]:
        raise RuntimeError("config.json lost head_dim")
    window = spec["config"].get("sliding_window")
    if window and cfg.get("sliding_window") != window:
        raise RuntimeError("config.json lost sliding_window")
    partial = spec["config"].get("partial_rotary_factor")
    if partial and rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) != partial:
        raise RuntimeError("config.json lost partial_rotary_factor")
    for key in ("factor", "short_factor", "long_factor", "original_max_position_embeddings"):
        if key in spec["rope"] and rope.get(key) != spec["rope"][key]:
            raise RuntimeError(f"config.json rope {key} {rope.get(key)!r}, "
                               f"expected {spec['rope'][key]!r}")
    original = spec["config"].get("original_max_position_embeddings")
    if original and cfg.get("original_max_position_embeddings") != original:
        raise RuntimeError("config.json lost original_max_position_embeddings")


def build(spec, out_dir):
    name = spec["name"]
    path = os.path.join(out_dir, name)
    log(f"== {name}")
    shutil.rmtree(path, ignore_errors=True)
    torch.manual_seed(spec["seed"])

    config = make_config(spec)
    model = AutoModelForCausalLM.from_config(config)
    if spec["config"]["tie_word_embeddings"]:
        model.tie_weights()
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise RuntimeError("tie_word_embeddings=True but lm_head is not tied after init")
    init_weights(model, spec["seed"])
    dtype = DTYPES[spec["dtype"]]
    model = model.to(dtype)
    # Declare the dtype in config.json (transformers 5 spells it "dtype", 4.x "torch_dtype").
    if TF_MAJOR >= 5:
        model.config.dtype = dtype
    else:
        model.config.torch_dtype = dtype
    save_kwargs = {"safe_serialization": True}
    if "max_shard_size" in spec:
        save_kwargs["max_shard_size"] = spec["max_shard_size"]
    try:
        model.save_pretrained(path, **save_kwargs)
    except TypeError:  # a transformers without the safe_serialization switch (always safetensors)
        save_kwargs.pop("safe_serialization")
        model.save_pretrained(path, **save_kwargs)
    # save_pretrained also writes generation_config.json, as real checkpoints have; kept.
    cfg = describe_checkpoint(path)
    check_config(cfg, spec)
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    if "max_shard_size" in spec:
        if not (2 <= len(shards) <= 4) or not os.path.exists(
                os.path.join(path, "model.safetensors.index.json")):
            raise RuntimeError(f"expected 2-4 shards with an index, got {shards}")
    elif shards != ["model.safetensors"]:
        raise RuntimeError(f"expected one model.safetensors, got {shards}")

    # Token sequence: BOS then seeded uniform ids (any id, EOS included: nothing stops on it).
    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    vocab = spec["config"]["vocab_size"]
    tokens = [BOS] + torch.randint(0, vocab, (spec["seq_len"] - 1,), generator=gen).tolist()
    T = len(tokens)

    native = load(path, dtype)
    if native.dtype != dtype:
        raise RuntimeError(f"reloaded model has dtype {native.dtype}, expected {dtype}")
    if spec["config"]["tie_word_embeddings"]:
        if not torch.equal(native.lm_head.weight, native.model.embed_tokens.weight):
            raise RuntimeError("tied embeddings did not survive the round trip")
    else:
        if torch.equal(native.lm_head.weight, native.model.embed_tokens.weight):
            raise RuntimeError("untied lm_head equals the embeddings")

    length_dependent = spec["rope"]["rope_type"] in LENGTH_DEPENDENT_ROPE
    generate_recomputes = spec["arch"] == "phi3" and spec["rope"]["rope_type"] == "longrope"
    ref, wide, attn = references(native, tokens, length_dependent, generate_recomputes)
    window = spec["config"].get("sliding_window")
    summarize_attention(attn, T, window)

    doc = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model": name,
        "dtype": spec["dtype"],
    }
    doc.update(ref)

    notes = {}
    if dtype == torch.float32:
        f64 = copy.deepcopy(native).double()
        exact = full_logits(f64, tokens)
        scale = max(1.0, float(exact.abs().max()))
        notes["f32_vs_f64_max_abs_logit_diff"] = r9((wide - exact).abs().max())
        notes["logit_scale"] = r9(scale)
        if length_dependent:
            # Calls of 1 and 7 tokens must see other tables than the one call over all tokens
            # (else the fixture would not test the per-call choice), and a float64 model must
            # agree with the F32 one call by call too.
            for entry in ref["chunked"]:
                chunk = entry["chunk"]
                gap = max(abs(a - b) for a, b in zip(entry["last_logits"], ref["last_logits"]))
                rows_gap = max(abs(a - b) for ra, rb in zip(entry["logits_rows"]["values"],
                                                             ref["logits_rows"]["values"])
                               for a, b in zip(ra, rb))
                notes[f"chunk{chunk}_vs_one_call_max_abs_logit_diff"] = r9(max(gap, rows_gap))
                if max(gap, rows_gap) < 1e-2:
                    raise RuntimeError(f"calls of {chunk} tokens give the one-call logits: the "
                                       "length-dependent RoPE is not exercised")
                exact_chunked = chunked_logits(f64, tokens, chunk)
                wide_chunked = chunked_logits(native, tokens, chunk)
                notes[f"chunk{chunk}_f32_vs_f64_max_abs_logit_diff"] = r9(
                    (wide_chunked - exact_chunked).abs().max())
    else:
        f32 = copy.deepcopy(native).float()
        ref32, wide32, attn32 = references(f32, tokens)
        summarize_attention(attn32, T, window)
        doc["reference_f32"] = ref32
        f64 = copy.deepcopy(native).double()
        exact = full_logits(f64, tokens)
        notes["f32_vs_f64_max_abs_logit_diff"] = r9((wide32 - exact).abs().max())
        notes["native_vs_f32_max_abs_logit_diff"] = r9((wide - wide32).abs().max())
        notes["native_vs_f32_argmax_agreement"] = r9(
            float((wide.argmax(-1) == wide32.argmax(-1)).double().mean()))
        notes["native_vs_f32_max_abs_nll_diff"] = r9(
            max(abs(a - b) for a, b in zip(ref["nll"], ref32["nll"])))
        notes["logit_scale"] = r9(max(1.0, float(wide32.abs().max())))
    doc["notes"] = notes
    log("  notes: " + json.dumps(notes))
    log(f"  min argmax margin {min(ref['argmax_margin']):.3g}, min greedy margin "
        f"{min(ref['greedy_margin']):.3g}, greedy {ref['greedy_new']}")
    if "reference_f32" in doc:
        r = doc["reference_f32"]
        log(f"  f32: min argmax margin {min(r['argmax_margin']):.3g}, min greedy margin "
            f"{min(r['greedy_margin']):.3g}, greedy {r['greedy_new']}")

    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    log(f"  reference.json: {os.path.getsize(os.path.join(path, 'reference.json'))} bytes")


def write_readme(out_dir):
    lines = [
        "# Hugging Face parity fixtures",
        "",
        "Generated by `tools/make_fixtures.py` (do not edit by hand); see its docstring for what",
        "each checkpoint exercises. Command, run from the repository root:",
        "",
        "    python3 tools/make_fixtures.py --out tests/fixtures",
        "",
        f"Produced with Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "(models run on the CPU, eager attention, one thread; weights and token sequences seeded).",
        "",
        "Each folder is a checkpoint written by `save_pretrained` (safetensors) plus",
        "`reference.json`:",
        "",
        "- `tokens`: BOS then seeded random ids; `nll[i] = -log p(tokens[i+1] | tokens[..i])` in",
        "  float64 from the model's logits; `argmax` per position and `argmax_margin` (top-1 minus",
        "  top-2 logit, to tell a genuine near tie from a bug);",
        "- `last_logits` and `logits_rows` (`positions`, `values`): full logits rows;",
        "- `greedy_prompt` (first 12 tokens), `greedy_new` (`generate`, greedy, 16 new tokens,",
        "  no EOS stop) and `greedy_margin`;",
        "- `last_row_attention[layer][head][key]`: attention probabilities of the last query row;",
        "- `notes`: F32-vs-F64 and native-vs-F32 logit gaps measured when the fixture was built;",
        "- `chunked` (longrope and dynamic RoPE only, whose table depends on each call's largest",
        "  position): the same per-position keys for the sequence fed with a KV cache in calls of",
        "  `chunk` tokens (1: step by step, and 7).",
        "",
        "BF16/F16 checkpoints hold the keys computed in the checkpoint's own dtype at the top",
        "level and the same keys after `model.float()` under `reference_f32`.",
        "",
    ]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="tests/fixtures",
                        help="output folder (default: %(default)s)")
    parser.add_argument("--only", action="append", help="build only this fixture (repeatable)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # one thread: the CPU reductions run in one fixed order
    log(f"python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}")
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for spec in FIXTURES:
        if args.only and spec["name"] not in args.only:
            continue
        try:
            build(spec, args.out)
        except Exception:  # keep building the others; the exit status still reports it
            traceback.print_exc()
            failed.append(spec["name"])
    write_readme(args.out)
    if failed:
        log(f"FAILED: {failed}")
        return 1
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
