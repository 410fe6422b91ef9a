#!/usr/bin/env python3
"""CPU tests of the TokenButler tools (tokenbutler.py, train_predictor.py, convert_tokenbutler.py,
make_butler_checkpoint.py, the committed fixtures) and of the results script
(real_model_results.sh with real_model_tables.py and corpus_text.py), at toy sizes. Plain Python: exits non-zero when
a check fails. Text for training: $KVLENS_SHARED_DIR/data/corpus (or --shared-dir), else the
repository's Markdown files.
    python3 tools/test_tools.py [--shared-dir ../shared] [-k NAME] [--shard K/N]
"""

import argparse
import contextlib
import io
import json
import random
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import convert_tokenbutler as ctb  # noqa: E402
import corpus_text  # noqa: E402
import make_butler_checkpoint as mbc  # noqa: E402
import tokenbutler as tb  # noqa: E402
import train_predictor as tp  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenbutler")
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def close(a, b, tol, what):
    err = (a - b).abs().max().item()
    check(err <= tol, f"{what}: max |diff| {err:.3g} > {tol:g}")
    return err


def tiny_llama(folder, seed=0, std=0.1, vocab=512, tokenizer=None):
    """A random Llama folder (GQA, llama3 RoPE) written without transformers' initialisation."""
    sizes = dict(mbc.SIZES["tiny"], hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16,
                 intermediate=128, vocab=vocab, max_position=128)
    os.makedirs(folder, exist_ok=True)
    config = mbc.llama_config(sizes, torch.float32)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    from safetensors.torch import save_file
    save_file(mbc.random_llama_state(sizes, torch.float32, seed, std),
              os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(folder, "tokenizer.json"))
    return folder


def small_predictor(variant, seed=0, dtype=torch.float32):
    return mbc.random_predictor(64, 8, 3, 2, 8, 32, variant, 500000.0, seed).to(dtype)


# ----------------------------------------------------------------------------- the module

@test
def parameter_counts():
    v1 = tb.parameter_count(2048, 8, 32, 16, 16, 512, "v1")
    hf = tb.parameter_count(2048, 8, 32, 16, 16, 512, "hf")
    check(v1 == 12_393_472, f"v1 at Llama-3.2-1B sizes: {v1}")
    check(hf - v1 == 4096, f"hf adds {hf - v1}, expected 4096")
    for variant, want in (("v1", v1), ("hf", hf)):
        with torch.device("meta"):
            module = tb.TokenButlerPredictor(2048, 32, 16, 8, 16, 512, variant, 500000.0)
        got = sum(p.numel() for p in module.parameters())
        check(got == want, f"{variant} module on the meta device: {got} != {want}")
        small = small_predictor(variant)
        got = sum(t.numel() for t in small.state_dict().values())
        check(got == tb.parameter_count(64, 2, 8, 3, 8, 32, variant), f"{variant} small: {got}")
    names = set(small_predictor("v1").state_dict())
    check("norm2.weight" in names and "norm_importance.weight" not in names, "v1 names")
    check({"norm_importance.weight", "norm_importance.bias"} <= set(small_predictor("hf").state_dict()),
          "hf names")


@test
def rope_matches_transformers():
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    for dim, theta in ((4, 500000.0), (16, 500000.0), (8, 10000.0), (64, 500000.0)):
        cfg = transformers.LlamaConfig(hidden_size=dim * 4, num_attention_heads=4, head_dim=dim,
                                       max_position_embeddings=131072, rope_theta=theta,
                                       rope_scaling=dict(mbc.LLAMA3_SCALING))
        ours = torch.tensor(tb.llama3_inv_freq(dim, theta), dtype=torch.float32)
        theirs = LlamaRotaryEmbedding(config=cfg).inv_freq.float()
        close(ours / theirs, torch.ones_like(ours), 1e-6, f"inv_freq dim {dim} theta {theta}")


@test
def slot_mapping_matches_reference_reshape():
    """The reference views the [B, L, N*H*d'] projection as [B, L, N, H, d'], permutes to
    [B, N, H, L, d'], flattens and re-views it [B*H, N, L, d']: entry (h, l) is slot h*N + l."""
    m = small_predictor("hf").double()
    x = torch.randn(1, 5, 64, dtype=torch.float64)
    with torch.no_grad():
        q, _ = m(x)
        hidden = m.norm_importance(m.norm2(x + m.ffn(m.norm1(_attention(m, x)))))
        raw = m.q_proj_importance(hidden)
    B, L, N, H, D = 1, 5, m.layers, m.heads, m.dDash
    ref = raw.view(B, L, N, H, D).permute(0, 2, 3, 1, 4).reshape(B * N * H, L, D).view(B * H, N, L, D)
    cos, sin = tb.rope_cos_sin(torch.arange(L)[None], m.importance_inv_freq, torch.float64, "cpu")
    ref = tb.apply_rope(ref, cos, sin)
    close(q[0].permute(1, 0, 2, 3), ref, 1e-12, "slot mapping")


def _attention(m, x):
    B, L, _ = x.shape
    r = m.input_proj(x)
    q, k, v = (p(r).view(B, L, m.heads, -1).transpose(1, 2)
               for p in (m.q_proj_attn, m.k_proj_attn, m.v_proj_attn))
    cos, sin = tb.rope_cos_sin(torch.arange(L)[None], m.attn_inv_freq, x.dtype, "cpu")
    q, k = tb.apply_rope(q, cos[:, None], sin[:, None]), tb.apply_rope(k, cos[:, None], sin[:, None])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(B, L, -1)


@test
def incremental_equals_full_sequence():
    torch.manual_seed(1)
    for variant in tb.VARIANTS:
        m = small_predictor(variant, seed=3)
        x = torch.randn(2, 32, 64)
        with torch.no_grad():
            full = tb.predicted_logits(*m(x))
            cache = tb.PredictorCache()
            for t in range(x.shape[1]):
                q, k = m(x[:, t:t + 1], cache=cache)
                close(tb.predicted_logits(q, k)[..., 0, :], full[..., t, :t + 1], 1e-5,
                      f"{variant} step {t}")
            cache = tb.PredictorCache()  # chunks of 5 (prefill then steps)
            for s in range(0, x.shape[1], 5):
                q, k = m(x[:, s:s + 5], cache=cache)
                got = tb.predicted_logits(q, k)
                close(got, full[..., s:s + q.shape[3], :k.shape[3]], 1e-5, f"{variant} chunk {s}")


@test
def true_logits_match_eager_attention():
    import transformers
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_llama(os.path.join(tmp, "m"), seed=4, std=0.2)
        model = tb.load_base_model(folder, attn_implementation="eager")
        ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            out = model(ids, output_attentions=True)
            x0, logits = tb.true_logits(model, ids)
        check(tuple(logits.shape) == (2, 2, 4, 40, 40), f"shape {tuple(logits.shape)}")
        check(tuple(x0.shape) == (2, 40, 64), f"layer-0 input shape {tuple(x0.shape)}")
        layer0 = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        close(x0, layer0, 0, "layer-0 input")
        mask = torch.triu(torch.ones(40, 40, dtype=torch.bool), 1)
        probs = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
        for l in (1, 2):
            close(probs[:, l - 1], out.attentions[l], 1e-5, f"layer {l} attention")
        check(logits[0, 0, 0].std() > 0.05, "attention not degenerate")
        del transformers


# ----------------------------------------------------------------------------- files

@test
def save_load_round_trip():
    with tempfile.TemporaryDirectory() as tmp:
        for variant in tb.VARIANTS:
            m = small_predictor(variant, seed=6)
            info = tb.save_predictor(m, os.path.join(tmp, variant), {"name": "x"}, {"seed": 6})
            back = tb.load_predictor(os.path.join(tmp, variant, "predictor.safetensors"))
            for k, v in m.state_dict().items():
                check(torch.equal(v, back.state_dict()[k]), f"{variant} {k}")
            check(info["parameters"] == tb.parameter_count(64, 2, 8, 3, 8, 32, variant), "count")
            with open(os.path.join(tmp, variant, "predictor.json")) as f:
                doc = json.load(f)
            for key in ("format", "version", "variant", "hidden_size", "attn_reduce_factor",
                        "heads", "layers", "dDash", "intdim", "layer_norm_eps", "rope_theta",
                        "rope_scaling", "parameters", "base_model", "training"):
                check(key in doc, f"predictor.json lacks {key}")
            check(doc["format"] == tb.FORMAT and doc["version"] == 1, "format/version")
            from safetensors import safe_open
            with safe_open(os.path.join(tmp, variant, "predictor.safetensors"), "pt") as f:
                check(all(f.get_tensor(k).dtype == torch.float32 for k in f.keys()), "F32")


@test
def fixtures_match_the_code():
    model_cache = {}
    for name in ("predictor-v1", "predictor-hf", "butler-bf16"):
        folder = os.path.join(FIXTURES, name)
        with open(os.path.join(folder, "reference.json")) as f:
            ref = json.load(f)
        if name.startswith("butler"):
            base = folder
            state, _ = ctb.load_butler_state(folder)
            predictor = ctb.build_predictor(state, folder, tb.BUTLER_PREFIX, tb.read_config(folder))
        else:
            base = os.path.join(ROOT, "tests", "fixtures", "llama-gqa-f32")
            predictor = tb.load_predictor(folder)
        check(predictor.variant == ref["variant"], f"{name} variant")
        if base not in model_cache:
            model_cache[base] = tb.load_base_model(base)
        model = model_cache[base]
        ids = torch.tensor([ref["tokens"]])
        with torch.no_grad():
            hidden = tb.layer_hidden_states(model, ids)
            x0 = tb.layer0_input(model, hidden)
            logits = tb.predicted_logits(*predictor.double()(x0.double()))[0]
        close(x0[0, 0].double(), torch.tensor(ref["layer0_input_first_row"], dtype=torch.float64),
              1e-6, f"{name} layer-0 input")
        for i, layer in enumerate(ref["layers"]):
            for h in range(ref["heads"]):
                for t, row in enumerate(ref["predicted"][i][h]):
                    want = torch.tensor(row, dtype=torch.float64)
                    close(logits[layer, h, t, :t + 1], want, 1e-8 + 1e-7 * want.abs().max().item(),
                          f"{name} layer {layer} head {h} row {t}")
        if "last_logits" in ref:
            with torch.no_grad():
                last = model(ids).logits[0, -1].double()
            close(last, torch.tensor(ref["last_logits"], dtype=torch.float64), 1e-5,
                  f"{name} last_logits")


@test
def convert_v1_pt_and_butler():
    import transformers
    base = os.path.join(ROOT, "tests", "fixtures", "llama-gqa-f32")
    with tempfile.TemporaryDirectory() as tmp:
        pt = os.path.join(tmp, "v1.pt")
        made = mbc.write_v1_pt(pt, base, dDash=8, intdim=32, attn_reduce_factor=2, seed=7)
        info = ctb.convert_v1_pt(pt, base, os.path.join(tmp, "conv"))
        back = tb.load_predictor(os.path.join(tmp, "conv"))
        check(info["variant"] == "v1" and back.variant == "v1", "v1 variant")
        for k, v in made.state_dict().items():
            check(torch.equal(v, back.state_dict()[k]), f"v1 .pt {k}")
        # errors name the file and the key
        state = torch.load(pt, weights_only=True)
        del state[0]["sparse_token_predictor.ffn.2.bias"]
        torch.save(state, pt)
        try:
            ctb.convert_v1_pt(pt, base, os.path.join(tmp, "bad"))
            check(False, "a missing key was accepted")
        except ctb.ConversionError as error:
            check(pt in str(error) and "sparse_token_predictor.ffn.2.bias" in str(error), str(error))
        state[0]["sparse_token_predictor.ffn.2.bias"] = torch.zeros(63)
        torch.save(state, pt)
        try:
            ctb.convert_v1_pt(pt, base, os.path.join(tmp, "bad"))
            check(False, "a mis-shaped tensor was accepted")
        except ctb.ConversionError as error:
            check("ffn.2.bias" in str(error) and "[63]" in str(error), str(error))

        butler = os.path.join(tmp, "butler")
        config, made = mbc.make_butler(butler, sizes="tiny", dtype=torch.bfloat16, seed=8)
        info = ctb.extract_butler(butler, os.path.join(tmp, "extracted"))
        back = tb.load_predictor(os.path.join(tmp, "extracted"))
        check(info["variant"] == "hf", "butler variant")
        for k, v in made.state_dict().items():
            check(torch.equal(v, back.state_dict()[k]), f"butler {k}")
        cfg = transformers.LlamaConfig.from_json_file(os.path.join(butler, "config.json"))
        check(cfg.dDash == 4 and cfg.num_hidden_layers == 3, "LlamaConfig.from_json_file")
        with open(os.path.join(butler, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        from safetensors import safe_open
        for key, shard in weight_map.items():
            with safe_open(os.path.join(butler, shard), "pt") as f:
                dtype = f.get_tensor(key).dtype
            want = torch.float32 if "_predictor." in key else torch.bfloat16
            check(dtype == want, f"{key}: {dtype}")
        del transformers


# ----------------------------------------------------------------------------- training

def training_data(tmp, shared):
    """Small text files: slices of the shared corpus, else the repository's Markdown."""
    corpus = os.path.join(shared, "data", "corpus") if shared else ""
    paths = []
    if os.path.isdir(corpus):
        with open(os.path.join(corpus, "c4-realnewslike-sample.jsonl"), encoding="utf-8") as f:
            lines = [next(f) for _ in range(60)]
        paths.append(os.path.join(tmp, "c4.jsonl"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.writelines(lines)
        with open(os.path.join(corpus, "tinyshakespeare.txt"), encoding="utf-8") as f:
            text = f.read(60000)
    else:
        print(f"  (no {corpus or 'shared dir'}: training on the repository's Markdown)")
        text = ""
        for d, _, files in sorted(os.walk(ROOT)):
            if "/build" in d or "/." in d:
                continue
            for name in sorted(files):
                if name.endswith(".md"):
                    with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                        text += f.read() + "\n\n"
    paths.append(os.path.join(tmp, "text.txt"))
    with open(paths[-1], "w", encoding="utf-8") as f:
        f.write(text)
    return paths


@test
def training_runs_and_is_deterministic():
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
        model = tiny_llama(os.path.join(tmp, "model"), seed=9, vocab=8192, tokenizer=tokenizer)
        data = training_data(tmp, ARGS.shared_dir)
        outs = []
        for run in ("a", "b"):
            out = os.path.join(tmp, run)
            cmd = [sys.executable, os.path.join(TOOLS, "train_predictor.py"), "--model", model,
                   "--data", *data, "--out", out, "--seq-len", "64", "--steps", "6",
                   "--eval-every", "3", "--eval-sequences", "2", "--intdim", "32",
                   "--attn-reduce-factor", "2", "--dDash", "8", "--seed", "3", "--device", "cpu",
                   "--doc-chars", "2000"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            check(proc.returncode == 0, f"train_predictor.py failed:\n{proc.stderr[-3000:]}")
            outs.append(out)
        for name in ("predictor.safetensors", "predictor.json", "train_log.json"):
            check(os.path.exists(os.path.join(outs[0], name)), f"missing {name}")
        try:
            import matplotlib  # noqa: F401
            check(os.path.exists(os.path.join(outs[0], "curves.png")), "missing curves.png")
        except ImportError:
            pass
        with open(os.path.join(outs[0], "predictor.safetensors"), "rb") as f:
            a = f.read()
        with open(os.path.join(outs[1], "predictor.safetensors"), "rb") as f:
            check(a == f.read(), "two runs with one seed wrote different predictors")
        with open(os.path.join(outs[0], "predictor.json")) as f:
            doc = json.load(f)
        check(doc["variant"] == "hf" and doc["layers"] == 3 and doc["heads"] == 4, "sizes")
        check(doc["parameters"] == tb.parameter_count(64, 2, 4, 3, 8, 32, "hf"), "parameters")
        train = doc["training"]
        for key in ("data", "steps", "seed", "recipe", "best_step", "heldout", "seconds",
                    "versions"):
            check(key in train, f"training lacks {key}")
        check(train["steps"] == 6 and train["seed"] == 3, "steps/seed")
        check(all(d["train_tokens"] > 0 and d["heldout_tokens"] > 0 for d in train["data"]),
              "token counts")
        held = train["heldout"]
        check(set(held["hit_rate_per_layer"]) == {"1", "2"}, "per-layer keys")
        check(0 < held["hit_rate"] <= 1 and held["mse"] > 0, "held-out metrics")
        with open(os.path.join(outs[0], "train_log.json")) as f:
            log = json.load(f)
        check([e["step"] for e in log["evals"]] == [0, 3, 6], "eval steps")
        check(len(log["train_loss"]) == 6, "loss curve")
        with contextlib.redirect_stdout(io.StringIO()):
            report = tp.report(tp.parse_args(
                ["--report-only", "--predictor", outs[0], "--model", model, "--data", *data,
                 "--seq-len", "64", "--eval-sequences", "2", "--doc-chars", "2000",
                 "--device", "cpu"]))
        check(abs(report["hit_rate"] - held["hit_rate"]) < 1e-9,
              f"report {report['hit_rate']} != training's {held['hit_rate']}")


@test
def loss_goes_down_on_one_batch():
    with tempfile.TemporaryDirectory() as tmp:
        model = tb.load_base_model(tiny_llama(os.path.join(tmp, "m"), seed=10, std=0.1))
        torch.manual_seed(0)
        predictor = tb.TokenButlerPredictor(64, 4, 3, 2, 8, 32, "hf", 500000.0)
        ids = torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(11))
        opt = torch.optim.AdamW(predictor.parameters(), lr=1e-3)
        losses = []
        for _ in range(30):
            loss = tp.step_loss(model, predictor, ids)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(predictor.parameters(), 20.0)
            opt.step()
            losses.append(loss.item())
        windows = [sum(losses[i:i + 5]) / 5 for i in range(0, 30, 5)]
        check(losses[-1] < 0.85 * losses[0] and windows == sorted(windows, reverse=True),
              f"loss {[round(v, 4) for v in losses]}")


@test
def answer_rows_and_weighted_loss():
    """--answer-weight: a coref record's answer span (UTF-8 byte offsets, a multi-byte character
    before it) flags the rows that predict each answer token; a line with a bad span is refused;
    the weighted loss adds the answer rows' term and is the plain loss at weight 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "So", "2", "×", "3", "=", "6", ".",
                                         "Its", "name", "is", ":", "Ka", "rel", "Dun"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    text = "So 2 × 3 = 6 . Its name is : Ka rel Dun"
    begin = len(text.encode("utf-8")) - len("Ka rel Dun")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": text, "answer_char_begin": begin,
                                "answer_char_end": len(text.encode("utf-8"))}) + "\n")
            f.write(json.dumps({"text": "Its name is : Dun"}) + "\n")
        spans = tp.answer_spans(path)
        check(spans == [(len(text) - len("Ka rel Dun"), len(text)), None], f"spans {spans}")
        ids, rows = tp.encode(tok, [text, "Its name is : Dun"], 0, 1, spans)
        flagged = [i for i, f in enumerate(rows[0]) if f]
        # ids: <s> So 2 x 3 = 6 . Its name is : Ka rel Dun </s>; Ka is at 12: rows 11, 12, 13.
        check(flagged == [11, 12, 13], f"flagged rows {flagged} of {ids[0]}")
        check(not any(rows[1]), "a record without a span flags nothing")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": "abc", "answer_char_begin": 2, "answer_char_end": 9}) + "\n")
        refused(lambda: tp.answer_spans(path), "UTF-8 byte offsets 0 <= begin < end <= 3")
        model = tb.load_base_model(tiny_llama(os.path.join(tmp, "m"), seed=12, std=0.1))
        torch.manual_seed(0)
        predictor = tb.TokenButlerPredictor(64, 4, 3, 2, 8, 32, "hf", 500000.0).eval()
        seq = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(13))
        answer = torch.zeros(1, 32, dtype=torch.bool)
        answer[0, 20:24] = True
        plain = tp.step_loss(model, predictor, seq).item()
        check(tp.step_loss(model, predictor, seq, answer, 0.0).item() == plain, "weight 0")
        check(tp.step_loss(model, predictor, seq, torch.zeros_like(answer), 5.0).item() == plain,
              "no answer rows")
        weighted = tp.step_loss(model, predictor, seq, answer, 5.0).item()
        check(weighted > plain * 1.5, f"weighted {weighted} vs plain {plain}")


@test
def hit_rate_definition():
    pred = torch.tensor([[[0.0, 0, 0], [1, 2, 0], [3, 1, 2]]])
    true = torch.tensor([[[0.0, 0, 0], [1, 1, 0], [3, 2, 1]]])
    # row 1: keep 1; pred picks key 1, true ties -> the more recent key 1: agree 2/2.
    # row 2: keep 2; pred {0, 2}, true {0, 1}: keys 0 agree, 1 and 2 differ: 1/3.
    got = tb.top_half_agreement(pred, true, min_row=1)
    check(abs(got.item() - (1 + 1 / 3) / 2) < 1e-12, f"hit rate {got.item()}")
    x = torch.randn(2, 20, 20)
    check(torch.all(tb.top_half_agreement(x, x, 8) == 1), "self agreement")


# ----------------------------------------------------------------------------- benchmarks

@test
def bench_transformers_toy_cpu():
    """tools/bench_transformers.py (the transformers side of tools/bench_gpu.sh) at toy size on
    the CPU, on a make_random_model.py checkpoint: every (mode, context) timed, one past the
    model's positions skipped with a reason rather than aborting the run."""
    import bench_transformers as btf
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m")
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, "make_random_model.py"),
                               "--out", model, "--hidden", "64", "--layers", "2", "--heads", "4",
                               "--kv-heads", "2", "--intermediate", "128", "--vocab", "256",
                               "--max-positions", "64"], capture_output=True, text=True)
        check(proc.returncode == 0, f"make_random_model.py failed:\n{proc.stderr[-2000:]}")
        out = os.path.join(tmp, "bench.json")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            btf.main(["--model", model, "--device", "cpu", "--dtype", "f32", "--contexts",
                      "16,40,100", "--modes", "sdpa,eager", "--steps", "3", "--warmup", "1",
                      "--prefill-chunk", "16", "--out", out])
        with open(out) as f:
            doc = json.load(f)
        for key in ("torch", "transformers", "device"):
            check(key in doc["machine"], f"machine lacks {key}")
        check(list(doc["modes"]) == ["eager", "sdpa"], f"modes {list(doc['modes'])}")
        for mode, per_context in doc["modes"].items():
            for context in ("16", "40"):
                e = per_context[context]
                check("skipped" not in e, f"{mode} {context}: {e.get('skipped')}")
                check(e["steps"] == 3 and 0 < e["min_ms"] <= e["median_ms"] <= e["max_ms"],
                      f"{mode} {context}: {e}")
                check(e["attn_implementation"] == mode and e["cache"] == "DynamicCache",
                      f"{mode} {context}: {e}")
            skipped = per_context["100"].get("skipped", "")
            check("max_position_embeddings" in skipped, f"{mode} 100: {per_context['100']}")


@test
def make_random_model_shards():
    """make_random_model.py --shards 3 --shard-dirs: three files of about equal size, the second
    in another folder and linked from the model's, an index naming every tensor once; kvlens-cli
    loads it and continues as it does from the one-file checkpoint of the same seed."""
    cli = kvlens_cli()
    with tempfile.TemporaryDirectory() as tmp:
        dims = ["--hidden", "64", "--layers", "3", "--heads", "4", "--kv-heads", "2",
                "--intermediate", "128", "--vocab", "256", "--max-positions", "64"]
        whole, split, spill = (os.path.join(tmp, n) for n in ("whole", "split", "spill"))
        for out, extra in ((whole, []), (split, ["--shards", "3", "--shard-dirs",
                                                 f"{split},{spill}"])):
            proc = subprocess.run([sys.executable, os.path.join(TOOLS, "make_random_model.py"),
                                   "--out", out] + dims + extra, capture_output=True, text=True)
            check(proc.returncode == 0, f"make_random_model.py failed:\n{proc.stderr[-2000:]}")
        names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
        check(sorted(os.listdir(spill)) == [names[1]], f"spill holds {os.listdir(spill)}")
        check(os.path.islink(os.path.join(split, names[1])), "shard 2 is not linked")
        with open(os.path.join(split, "model.safetensors.index.json")) as f:
            index = json.load(f)
        check(sorted(set(index["weight_map"].values())) == names, f"{set(index['weight_map'].values())}")
        sizes = [os.path.getsize(os.path.join(split, n)) for n in names]
        check(max(sizes) < 2 * min(sizes), f"shard sizes {sizes}")
        if not cli:
            print("  (kvlens-cli not run: no kvlens-cli; build it or set KVLENS_CLI)")
            return
        outs = []
        for model in (whole, split):
            proc = subprocess.run([cli, "generate", "--backend", "cpu", "--model", model,
                                   "--tokens", "1,2,3", "--max-new", "4", "--ids"],
                                  capture_output=True, text=True)
            check(proc.returncode == 0, f"generate failed:\n{proc.stderr[-2000:]}")
            outs.append(proc.stdout)
        check(outs[0] == outs[1], f"one file {outs[0]!r}, shards {outs[1]!r}")


def run_bench_gpu_tiny(parts, work):
    """tools/bench_gpu.sh --tiny --part PARTS on the CPU into `work`, checked to succeed; None
    (said) when there is no kvlens-cli to run it with."""
    cli = kvlens_cli()
    if not cli:
        print("  (skipped: no kvlens-cli; build it or set KVLENS_CLI)")
        return None
    build = os.path.dirname(os.path.dirname(os.path.abspath(cli)))
    env = dict(os.environ, KVLENS_BENCH_BACKEND="cpu", KVLENS_BENCH_REPEATS="1",
               PYTHON=sys.executable)
    proc = subprocess.run([os.path.join(TOOLS, "bench_gpu.sh"), build, "--tiny", "--part", parts,
                           "--work", work], capture_output=True, text=True, env=env)
    check(proc.returncode == 0, f"bench_gpu.sh failed:\n{proc.stdout[-3000:]}"
          f"\n{proc.stderr[-2000:]}")
    return proc


@test
def bench_gpu_tiny_cpu_parts():
    """tools/bench_gpu.sh --tiny on the CPU, issue 43's parts: `tokenbutler` (a run and its
    predictor against a dense step at two contexts) and `sparse` (each policy at 0.5 and 0.9, its
    attention over the kept keys against dense attention): every figure present, each with its
    target."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_bench_gpu_tiny("tokenbutler,sparse", tmp)
        if proc is None:
            return
        with open(os.path.join(tmp, "tokenbutler.json")) as f:
            butler = json.load(f)
        check([r["context"] for r in butler["rows"]] == [32, 64], f"rows {butler['rows']}")
        for r in butler["rows"]:
            check(r["ratio"] > 0 and 0 < r["predictor_share"], f"row {r}")
        with open(os.path.join(tmp, "sparse.json")) as f:
            sparse = json.load(f)
        runs = [(r["policy"], r["sparsity"]) for r in sparse["rows"]]
        check(len(runs) == 10 and ("tokenbutler", 0.9) in runs, f"runs {runs}")
        for r in sparse["rows"]:
            check(0 < r["kept_share"] <= 1 and r["attention_seconds"] > 0
                  and r["dense_attention_seconds"] > 0, f"row {r}")
            # (the keys some head of a group keeps: at least the per-head share, the target's basis)
            check(r["kept_share"] - 1e-9 <= r["read_share"] <= 1, f"row {r}")
        check(len(sparse["targets"]) == 10, f"targets {sparse['targets']}")
        for part in ("tokenbutler", "sparse"):
            check(f"-- part {part}: done" in proc.stdout, f"{part} not done:\n{proc.stdout}")


@test
def bench_gpu_tiny_cpu_lockstep():
    """tools/bench_gpu.sh --tiny --part lockstep on the CPU (issue 43's item 2): the 8 policies in
    lockstep against a dense step, the same with KVLENS_GEMV_MMA=1, and each policy's run alone
    with its own work as a share of the dense step, each with its target."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_bench_gpu_tiny("lockstep", tmp)
        if proc is None:
            return
        with open(os.path.join(tmp, "lockstep.json")) as f:
            lockstep = json.load(f)
        check(len(lockstep["runs"]) == 1 and lockstep["runs"][0]["lockstep"]["runs"] == 8,
              f"runs {lockstep['runs']}")
        own = lockstep["own_work"]
        names = [r["policy"] for r in own]
        check(names == ["h2o", "quest", "snapkv", "streaming", "keydiff", "tokenfilter",
                        "lazyllm"], f"policies {names}")
        for r in own:
            check(r["dense_step_seconds"] > 0 and "--policies " + r["policy"] in r["command"],
                  f"row {r}")
            # (one repeat: the median share is that repeat's own work over its dense step)
            check(abs(r["own_seconds"] / r["dense_step_seconds"] - r["share_of_dense_step"])
                  < 1e-9, f"row {r}")
        whats = [t["what"] for t in lockstep["targets"]]
        check(len(whats) == 8 and sum("own work" in w for w in whats) == 7, f"targets {whats}")
        # The same lockstep run with the tensor-core products switched on (no target of its own).
        mma = lockstep["tensor_core_runs"]
        check(len(mma) == 1 and mma[0]["lockstep"]["runs"] == 8 and
              "KVLENS_GEMV_MMA=1" in mma[0]["command"], f"tensor-core runs {mma}")
        check("tensor cores: ratio (median of 1)" in proc.stdout, proc.stdout)
        check("-- part lockstep: done" in proc.stdout, f"not done:\n{proc.stdout}")


@test
def cuda_timeline_on_a_made_up_trace():
    """tools/cuda_timeline.py on a trace whose figures are known: 3 steps of 2 layers (the marker
    kernel on stream 7), a product per layer, a lane's kernel (stream 9) in each step's first
    layer; the last two whole steps are counted. Bad rows are refused with the file and line."""
    import cuda_timeline as ct
    us = 1000
    rows = []
    for step in range(3):
        t = step * 200
        for layer in range(2):
            m = t + 100 * layer
            rows.append(f"K,{m * us},{(m + 10) * us},7,{len(rows)},4,rope_append_kernel")
            rows.append(f"K,{(m + 50) * us},{(m + 90) * us},7,{len(rows)},132,gemv_row_kernel")
            rows.append(f"R,{(m + 41) * us},{(m + 45) * us},1,{len(rows) - 1},0,cudaLaunchKernel")
        rows.append(f"K,{(t + 20) * us},{(t + 40) * us},9,{len(rows)},8,select_top_k_kernel")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.csv")
        with open(path, "w") as f:
            f.write("\n".join(rows) + "\n")
        r = ct.analyse(*ct.load(path), marker="rope_append", layers=2, steps=8)
        check(r["steps"] == 2 and r["lockstep"] and r["main_stream"] == 7, f"steps {r}")
        for key, want in (("span_us", 200), ("busy_us", 120), ("main_us", 100),
                          ("others_us", 20), ("overlap_us", 0), ("idle_us", 80),
                          ("kernels", 5)):
            check(abs(r[key] - want) < 1e-9, f"{key} {r[key]} != {want}")
        phases = r["layer_phases_us"]
        for key, want in (("layer", 100), ("marker to the other streams' first kernel", 20),
                          ("the other streams' first start to last end", 20),
                          ("their last end to the next marker", 60)):
            check(abs(phases[key] - want) < 1e-9, f"{key}: {phases[key]} != {want}")
        wait = r["launch_wait_us"]["median"]
        check(abs(wait - 5) < 1e-9, f"launch wait {wait}")
        check(r["launch_wait_us"]["matched"] == 4, f"waits {r['launch_wait_us']}")
        names = {(where, name): count for where, name, count, _ in r["kernels_by_name"]}
        check(names == {("main", "rope_append_kernel"): 2, ("main", "gemv_row_kernel"): 2,
                         ("other", "select_top_k_kernel"): 1}, f"names {names}")
        check(ct.short_name("void kvlens::cuda::(anonymous namespace)::gemv_row_kernel<float, "
                            "(kvlens::cuda::GemvMode)0>(float const*, int)") == "gemv_row_kernel",
              "short name")
        with open(path, "a") as f:
            f.write("K,1,2,oops\n")
        try:
            ct.load(path)
            raise AssertionError("a bad row was read")
        except ValueError as e:
            check(f"trace.csv:{len(rows) + 1}: want" in str(e), f"message {e}")
        # The injection library builds where there is a CUDA toolkit with CUPTI (as
        # tools/cuda_timeline.sh builds it on the GPU machine).
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        if shutil.which("c++") and os.path.exists(os.path.join(cuda, "include", "cupti.h")):
            subprocess.run(["c++", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                            "-I" + os.path.join(cuda, "include"),
                            os.path.join(TOOLS, "cuda_trace.cpp"),
                            "-o", os.path.join(tmp, "libtrace.so")], check=True)


@test
def bench_gpu_tiny_cpu_multi():
    """tools/bench_gpu.sh --tiny --part multi on the CPU (issue 44's part; 2 CPU ranks stand for
    2 GPUs): the 8B shape on one rank and split, a 70B-shaped proxy of 4 layers split, and the
    coref sweep on one engine and two: every figure measured, each with its target."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_bench_gpu_tiny("multi", tmp)
        if proc is None:
            return
        with open(os.path.join(tmp, "multi.json")) as f:
            multi = json.load(f)
        check(multi["gpus"] == 2, f"gpus {multi.get('gpus')}")
        check(multi["8b"]["one_gpu_step_seconds"] > 0 and multi["8b"]["split_step_seconds"] > 0,
              f"8b {multi.get('8b')}")
        check(multi["70b"]["tensor_parallel"] == 2 and multi["70b"]["layers"] == 4,
              f"70b {multi.get('70b')}")
        check(multi["sweep"]["one_gpu_seconds"] > 0 and multi["sweep"]["split_seconds"] > 0,
              f"sweep {multi.get('sweep')}")
        check(len(multi["targets"]) == 3, f"targets {multi['targets']}")
        check(all(t["value"] is not None for t in multi["targets"]), f"{multi['targets']}")
        check("-- part multi: done" in proc.stdout, f"multi not done:\n{proc.stdout}")


@test
def bf16_reference_toy_cpu():
    """tools/make_bf16_reference.py on the demo model at toy size on the CPU: per prompt the
    BF16 and F32 greedy runs and, per step, the BF16 top ids with both dtypes' logits, and the
    self-consistency the C++ tests rely on (top ids sorted by BF16 logit, greedy = a top id:
    BF16 logits tie often, and argmax and topk break ties differently)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ref.json")
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, "make_bf16_reference.py"),
                               "--model", os.path.join(ROOT, "assets", "models", "demo"),
                               "--out", out, "--device", "cpu", "--max-new", "4", "--top", "5",
                               "--prompt", "Once upon a time"], capture_output=True, text=True)
        check(proc.returncode == 0, f"make_bf16_reference.py failed:\n{proc.stderr[-2000:]}")
        with open(out) as f:
            doc = json.load(f)
        check(doc["dtype"] == "bfloat16" and doc["max_new"] == 4, f"header {doc['dtype']}")
        (entry,) = doc["prompts"]
        check(entry["prompt_tokens"][0] == 0, "BOS (id 0) first")
        check(len(entry["greedy_bf16"]) == 4 and len(entry["greedy_f32"]) == 4, "4 new tokens")
        check(len(entry["steps"]) == 4, "a step per new token")
        for step, token in zip(entry["steps"], entry["greedy_bf16"]):
            best = [i for i, v in zip(step["top_ids"], step["bf16"]) if v == step["bf16"][0]]
            check(token in best, f"greedy {token} is not a top id {step}")  # BF16 ties happen
            check(step["bf16"] == sorted(step["bf16"], reverse=True), f"unsorted {step}")
            check(len(step["f32"]) == 5 and step["margin_bf16"] >= 0, f"step {step}")
        check(entry["max_top_gap_bf16_vs_f32"] < 1.0, f"gap {entry['max_top_gap_bf16_vs_f32']}")


# ----------------------------------------------------------------------------- results script

def kvlens_cli():
    """The kvlens-cli to run: $KVLENS_CLI (ctest sets it), else the default build's."""
    path = os.environ.get("KVLENS_CLI") or os.path.join(ROOT, "build", "app", "kvlens-cli")
    return path if os.access(path, os.X_OK) else None


def paper_pools_stand_in(path):
    """A small file shaped like the TokenButler paper's mrcr_custom.json (its five keys, a
    repeated name as the published file has), with pools of our own making."""
    pools = {
        "location_names": ["Wexmoor Hollow", "Tarrabeck", "Quillsend Reach", "Ombridge",
                           "Halvenmoor", "Frostmere Hithe", "Tarrabeck"],
        "loc_intro_tieback_list": [
            {"location_intro": "Past the salt flats stands a village of blue windmills. "
                               "The place is:",
             "tieback_question": "Recall the village of blue windmills? It is called"},
            {"location_intro": "A harbour town keeps a lighthouse painted with red stripes. "
                               "The place is:",
             "tieback_question": "The harbour town with the striped lighthouse is named"},
            {"location_intro": "Deep in the forest lies a hamlet built around a stone well. "
                               "The place is:",
             "tieback_question": "Remember the hamlet around the stone well? It is called"},
        ],
        "philosophy_statements": ["Patience is a kind of courage.",
                                  "A question can outlive its answer.",
                                  "Habits are votes for who we become."],
        "food_descriptions": ["Warm barley bread tastes of honey.",
                              "A stew of lentils simmers all day.",
                              "Pears baked in cider turn golden."],
        "math_problems": ["A baker sells 12 loaves and bakes 7 more, so 12 + 7 = 19 loaves.",
                          "Three crates of 8 apples hold 3 * 8 = 24 apples.",
                          "A rope of 30 metres cut in half gives 15 metres."],
    }
    with open(path, "w") as f:
        json.dump(pools, f, indent=1)
    return path


@test
def heldout_split_is_shared():
    """train_predictor.py holds back what corpus_text.py writes: one function, the trailing
    documents holding >= frac of the characters, never all of them."""
    check(tp.heldout_split is corpus_text.heldout_split, "train_predictor has its own split")
    check(tp.read_documents is corpus_text.read_documents, "train_predictor reads on its own")
    docs = ["a" * 50, "b" * 30, "c" * 15, "d" * 5]
    check(corpus_text.heldout_split(docs, 0.05) == (docs[:3], docs[3:]), "5% = the last doc")
    check(corpus_text.heldout_split(docs, 0.15) == (docs[:2], docs[2:]), "15%: two docs")
    check(corpus_text.heldout_split(docs, 1.0) == (docs[:1], docs[1:]), "never all of them")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "c.jsonl")
        with open(corpus, "w") as f:
            for i in range(50):
                f.write(json.dumps({"text": f"Document {i}. " + "word " * (10 + i)}) + "\n")
        out = os.path.join(tmp, "held.txt")
        corpus_text.main(["--heldout", corpus, "--out", out])
        _, held = tp.heldout_split(tp.read_documents(corpus, 8000), 0.02)
        with open(out) as f:
            check(f.read() == "\n\n".join(held) + "\n", "written text != the held-out docs")
        check(held and held[-1].startswith("Document 49."), f"held out {len(held)} docs")


@test
def training_pools_disjoint_and_valid():
    """tools/make_training_pools.py at toy size: train and select names disjoint and free of the
    excluded file's, name pieces split by id parity, arithmetic right, every lead ending in the
    marker with a question that shares one of its words; the C++ generator accepts both files."""
    import make_training_pools as mtp
    tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
    bundled = os.path.join(ROOT, "assets", "benchmarks", "coref", "pools.json")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split in ("train", "select"):
            files[split] = os.path.join(tmp, split + ".json")
            subprocess.run([sys.executable, os.path.join(TOOLS, "make_training_pools.py"),
                            "--split", split, "--out", files[split], "--names", "3000",
                            "--intros", "120", "--distractors", "50", "--pieces-of", tokenizer,
                            "--exclude", bundled, "--ornate-share", "0.5"], check=True,
                           capture_output=True)
        pools = {k: json.load(open(v, encoding="utf-8")) for k, v in files.items()}
        # Half the leads are ornate scenes; their questions paraphrase (not one repeats its lead's
        # centrepiece word for word in every entry) and the select split's scenes use held-back parts.
        for split, p in pools.items():
            ornate = [e for e in p["loc_intro_tieback_list"]
                      if any(s[0] in e["location_intro"].lower() for s in mtp.SETTINGS)]
            check(len(ornate) == 60, f"{split}: {len(ornate)} ornate leads, expected 60")
            check(any(not any(c[0] in e["tieback_question"] for c in mtp.ORNATE_COLOURS)
                      for e in ornate), f"{split}: no question paraphrases its colour")
        rng = random.Random(0)
        train_settings = {s[0] for s in mtp.split_parts(rng, mtp.SETTINGS, False)}
        select_settings = {s[0] for s in mtp.split_parts(rng, mtp.SETTINGS, True)}
        check(not train_settings & select_settings, "select's settings are held back from train")
        train = {n.lower() for n in pools["train"]["location_names"]}
        select = {n.lower() for n in pools["select"]["location_names"]}
        check(len(train) == 3000 and len(select) == 2000, "name counts")
        check(not train & select, f"{len(train & select)} names in both splits")
        with open(bundled, encoding="utf-8") as f:
            excluded = {n.lower() for n in json.load(f)["location_names"]}
        check(not (train | select) & excluded, "an excluded name was kept")
        even, odd = set(mtp.vocabulary_pieces(tokenizer, 0)), set(mtp.vocabulary_pieces(tokenizer, 1))
        check(even and odd and not even & odd, "the two piece sets must be disjoint")
        for split, p in pools.items():
            mtp.check_math(p["math_problems"])
            for entry in p["loc_intro_tieback_list"]:
                check(entry["location_intro"].endswith("The place is:"), entry["location_intro"])
                lead = set(re.findall(r"[a-z]{4,}", entry["location_intro"].lower()))
                question = set(re.findall(r"[a-z]{4,}", entry["tieback_question"].lower()))
                check(lead & question - {"place", "called", "name", "where", "which"},
                      f"{split}: the question shares no word with its lead: {entry}")
        # The same arguments give the same file.
        again = os.path.join(tmp, "again.json")
        subprocess.run([sys.executable, os.path.join(TOOLS, "make_training_pools.py"), "--split",
                        "select", "--out", again, "--names", "3000", "--intros", "120",
                        "--distractors", "50", "--pieces-of", tokenizer, "--exclude", bundled,
                        "--ornate-share", "0.5"], check=True, capture_output=True)
        check(open(again).read() == open(files["select"]).read(), "not deterministic")
        cli = kvlens_cli()
        if cli:
            for split, path in files.items():
                out = os.path.join(tmp, split + ".jsonl")
                proc = subprocess.run([cli, "coref-samples", "--coref-pools", path, "--count",
                                       "20", "--hard", "--out", out], capture_output=True,
                                      text=True)
                check(proc.returncode == 0, f"coref-samples refused {split}: {proc.stderr}")


@test
def demo_training_toy_cpu():
    """tools/train_demo_model.py with selection pools of their own and copy sequences, on the
    CPU at toy size: it trains, evaluates each kind, keeps the given tokenizer and writes a
    loadable folder."""
    shared = ARGS.shared_dir
    corpus = os.path.join(shared, "data", "corpus", "tinyshakespeare.txt")
    cli = kvlens_cli()
    if not os.path.exists(corpus) or not cli:
        print("  (skipped: needs ../shared/data/corpus and kvlens-cli)")
        return
    tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        with open(corpus, encoding="utf-8") as f, \
                open(os.path.join(data, "tinyshakespeare.txt"), "w", encoding="utf-8") as g:
            g.write(f.read(120000))
        samples = {}
        for name, extra in (("train", ["--count", "40", "--seed", "5"]),
                            ("normal", ["--count", "8", "--seed", "6"]),
                            ("hard", ["--count", "8", "--seed", "7", "--hard"])):
            samples[name] = os.path.join(tmp, name + ".jsonl")
            subprocess.run([cli, "coref-samples", *extra, "--out", samples[name]], check=True,
                           capture_output=True)
        out = os.path.join(tmp, "model")
        proc = subprocess.run(
            [sys.executable, os.path.join(TOOLS, "train_demo_model.py"), "--device", "cpu",
             "--data-dir", data, "--tokenizer", tokenizer, "--coref-train", samples["train"],
             "--coref-select", f"normal={samples['normal']}", f"hard={samples['hard']}",
             "--out", out, "--work-dir", os.path.join(tmp, "work"), "--layers", "1",
             "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--intermediate", "64",
             "--batch", "4", "--steps", "2", "--eval-every", "1", "--log-every", "1",
             "--warmup", "1", "--copy-batch", "2", "--copy-len", "4", "8",
             "--context-copy-batch", "2", "--attention-dropout", "0.1"],
            capture_output=True, text=True)
        check(proc.returncode == 0, f"train_demo_model.py failed:\n{proc.stderr[-3000:]}")
        check("copy loss" in proc.stdout and "context-copy loss" in proc.stdout,
              "the copy and context-copy sequences are trained and logged")
        with open(os.path.join(out, "train_log.json")) as f:
            log = json.load(f)
        check(log["steps_done"] == 2, "steps")
        check({"coref_normal", "coref_hard"} <= set(log["final"]), "both kinds evaluated")
        check(log["final"]["coref_normal"]["samples"] == 8, "the selection samples are not cut")
        check(open(os.path.join(out, "tokenizer.json")).read() == open(tokenizer).read(),
              "the given tokenizer is kept")
        with open(os.path.join(out, "config.json")) as f:
            check(json.load(f)["attention_dropout"] == 0.0, "dropout is for training only")
        info = subprocess.run([cli, "info", "--model", out], capture_output=True, text=True)
        check(info.returncode == 0, f"kvlens-cli cannot open the result: {info.stderr}")


@test
def tova_reference_reproduces_fixture():
    """tools/tova_reference.py (the authors' TOVA cache re-implemented) rebuilds the committed
    tests/fixtures/tova/reference.json: the same kept positions at every step and layer, the same
    next-token losses to float rounding."""
    cli = kvlens_cli()
    if not cli:
        print("  (skipped: no kvlens-cli; build it or set KVLENS_CLI)")
        return
    committed_path = os.path.join(ROOT, "tests", "fixtures", "tova", "reference.json")
    with open(committed_path) as f:
        committed = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reference.json")
        proc = subprocess.run(
            [sys.executable, os.path.join(TOOLS, "tova_reference.py"), "--kvlens-cli", cli,
             "--cache-size", str(committed["cache_size"]), "--tokens-from-coref",
             str(committed["coref_sample"]["index"]), "--out", out],
            capture_output=True, text=True)
        check(proc.returncode == 0, f"tova_reference.py failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            fresh = json.load(f)
    check(fresh["tokens"] == committed["tokens"], "tokens")
    check(fresh["kept"] == committed["kept"], "kept positions differ from the fixture")
    worst = max(abs(a - b) for a, b in zip(fresh["nll"], committed["nll"]))
    check(worst < 1e-5, f"next-token losses differ by {worst}")



def regenerate(tool, fixture):
    """Runs tools/TOOL as the committed tests/fixtures/FIXTURE/reference.json was made (its
    co-reference sample) and returns (committed, fresh); None where no kvlens-cli is built."""
    cli = kvlens_cli()
    if not cli:
        print("  (skipped: no kvlens-cli; build it or set KVLENS_CLI)")
        return None
    with open(os.path.join(ROOT, "tests", "fixtures", fixture, "reference.json")) as f:
        committed = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reference.json")
        proc = subprocess.run(
            [sys.executable, os.path.join(TOOLS, tool), "--kvlens-cli", cli,
             "--tokens-from-coref", str(committed["coref_sample"]["index"]), "--out", out],
            capture_output=True, text=True)
        check(proc.returncode == 0, f"{tool} failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            fresh = json.load(f)
    check(fresh["tokens"] == committed["tokens"], "tokens")
    return committed, fresh


def close_losses(fresh, committed, what):
    worst = max(abs(a - b) for a, b in zip(fresh, committed))
    check(len(fresh) == len(committed) and worst < 1e-5, f"{what}: losses differ by {worst}")


@test
def allocator_reference_reproduces_fixture():
    """tools/allocator_reference.py (PyramidKV's and Ada-KV's code re-implemented) rebuilds the
    committed tests/fixtures/allocators/reference.json: the same dropped positions and budgets at
    every step, layer and head, the same next-token losses to float rounding; and its schedule
    functions keep the totals the docs promise."""
    pair = regenerate("allocator_reference.py", "allocators")
    if pair:
        committed, fresh = pair
        for name in ("pyramidkv", "adakv"):
            check(fresh[name]["settings"] == committed[name]["settings"], f"{name} settings")
            check(fresh[name]["dropped"] == committed[name]["dropped"], f"{name}: dropped differ")
            check(fresh[name]["budgets"] == committed[name]["budgets"], f"{name}: budgets differ")
            close_losses(fresh[name]["nll"], committed[name]["nll"], name)
    import allocator_reference as ar
    # The authors' line (steps floored) overshoots with min 0; kvlens's rounding sums exactly.
    check(ar.authors_pyramid(16, 100, 8, 20) == [32, 28, 24, 20, 16, 12, 8, 4], "authors' line")
    check(ar.pyramid_schedule(16, 100, 8, 20) == [32, 27, 23, 18, 14, 9, 5, 0], "kvlens's line")
    # Room: layer 0 may take 5, the 27 it cannot goes to the shallowest layers with room.
    got = ar.pyramid_allocation(16, 100, [5, -1, -1, -1, -1, -1, -1, -1], 20)
    check(got == [5, 54, 23, 18, 14, 9, 5, 0], f"room {got}")
    check(ar.forced_begin(40, 25, 8) == 32 and ar.forced_begin(40, 5, 8) == 36, "forced part")
    # The error path: a checkpoint that is not a Llama (the step-by-step forward is Llama's).
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_llama(os.path.join(tmp, "model"))
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        config.update(model_type="mistral", architectures=["MistralForCausalLM"])
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        refused(lambda: ar.load_llama(folder), "model_type is 'mistral', expected 'llama'")


@test
def duo_reference_reproduces_fixture():
    """tools/duo_reference.py (DuoAttention's head pattern and streaming cache re-implemented)
    rebuilds the committed tests/fixtures/duo/reference.json: the same patterns and streaming
    sets, the same losses to float rounding; its quantile rule keeps s of the heads streaming."""
    pair = regenerate("duo_reference.py", "duo")
    if pair:
        committed, fresh = pair
        check(fresh["streaming"] == committed["streaming"], "streaming sets differ")
        for a, b in zip(fresh["runs"], committed["runs"]):
            check(a["pattern"] == b["pattern"], f"sparsity {b['sparsity']}: pattern differs")
            close_losses(a["nll"], b["nll"], f"sparsity {b['sparsity']}")
    import numpy as np
    import duo_reference as dr
    gates = np.linspace(0.0, 1.0, 8).reshape(2, 4)
    check(dr.sparsify(gates, 0.5, 0).tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]], "quantile")
    check(dr.sparsify(gates, 0.0, 0).sum() == 8 and dr.sparsify(gates, 1.0, 0).sum() == 0,
          "sparsity 0 keeps every head full, 1 none")
    check(dr.streaming_columns(19, 4, 15) == [[0, 20]], "everything while it fits")
    check(dr.streaming_columns(20, 4, 15) == [[0, 4], [5, 21]], "sinks + recent + new")
    # The error paths: tied gates across the threshold, a gates file missing or of another shape.
    refused(lambda: dr.noise_free_pattern(np.full((2, 4), 0.5), 0.5), "depends on the tie")
    from safetensors.numpy import save_file
    with tempfile.TemporaryDirectory() as tmp:
        refused(lambda: dr.load_gates(tmp, 2, 4), "missing (tools/train_duo_gates.py")
        save_file({"gates": np.zeros((2, 3), dtype=np.float32)},
                  os.path.join(tmp, "duo_gates.safetensors"))
        refused(lambda: dr.load_gates(tmp, 2, 4), "gates (2, 3), expected (2, 4)")


def refused(call, message):
    """call() must exit (sys.exit) with a message containing `message`."""
    try:
        call()
    except SystemExit as e:
        check(message in str(e.code), f"exit message {e.code!r} lacks {message!r}")
        return
    raise AssertionError(f"not refused: expected an exit saying {message!r}")

@test
def calibrate_channels_toy_cpu():
    """tools/calibrate_channels.py on a tiny Llama at toy size: loki's bases are orthonormal with
    the explained variance descending, doublesparsity's channels are each head's permutation by
    descending importance, both match the statistics recomputed from transformers' own q and k,
    and two runs write the same bytes."""
    from safetensors.torch import load_file
    tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_llama(os.path.join(tmp, "model"), vocab=8192, tokenizer=tokenizer)
        corpus = os.path.join(tmp, "corpus.txt")
        with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f, \
                open(corpus, "w", encoding="utf-8") as g:
            g.write(f.read())
        outs = []
        for run in range(2):
            out = os.path.join(tmp, f"out{run}")
            proc = subprocess.run(
                [sys.executable, os.path.join(TOOLS, "calibrate_channels.py"), "--model", model,
                 "--corpus", corpus, "--tokens", "256", "--block-tokens", "64", "--batch", "2",
                 "--out", out], capture_output=True, text=True)
            check(proc.returncode == 0, f"calibrate_channels.py failed:\n{proc.stderr[-3000:]}")
            outs.append(out)
        for name in ("loki_pca.safetensors", "doublesparsity_channels.safetensors"):
            with open(os.path.join(outs[0], name), "rb") as a, \
                    open(os.path.join(outs[1], name), "rb") as b:
                check(a.read() == b.read(), f"{name}: two runs differ")
        loki = load_file(os.path.join(outs[0], "loki_pca.safetensors"))
        ds = load_file(os.path.join(outs[0], "doublesparsity_channels.safetensors"))
        check(tuple(loki["basis"].shape) == (3, 2, 16, 16), f"basis {tuple(loki['basis'].shape)}")
        check(tuple(ds["channels"].shape) == (3, 4, 16), f"channels {tuple(ds['channels'].shape)}")
        basis = loki["basis"].double()
        identity = torch.eye(16, dtype=torch.float64).expand(3, 2, 16, 16)
        close(basis.transpose(-1, -2) @ basis, identity, 1e-5, "basis orthonormal")
        ratio = loki["explained_variance_ratio"]
        check(bool((ratio[..., :-1] >= ratio[..., 1:] - 1e-7).all()), "variance not descending")
        close(ratio.sum(-1), torch.ones(3, 2), 1e-5, "variance ratios sum to 1")
        channels = ds["channels"].long()
        check(bool((channels.sort(-1).values == torch.arange(16)).all()), "not permutations")
        ordered = torch.gather(ds["importance"], -1, channels)
        check(bool((ordered[..., :-1] >= ordered[..., 1:]).all()), "importance not descending")

        # The statistics again from transformers' own attention inputs: q and k after RoPE.
        from transformers import AutoModelForCausalLM
        import calibrate_channels as cc
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
        blocks = cc.token_blocks(model, [corpus], 256, 64)
        modeling = sys.modules[type(hf.model.layers[0].self_attn).__module__]
        original = modeling.apply_rotary_pos_emb
        calls = []  # (q, k) after RoPE, layer by layer, forward by forward

        def spy(q, k, cos, sin, *rest, **kw):
            q2, k2 = original(q, k, cos, sin, *rest, **kw)
            calls.append((q2, k2))
            return q2, k2
        modeling.apply_rotary_pos_emb = spy
        try:
            with torch.no_grad():
                for start in range(0, blocks.shape[0], 2):
                    hf(blocks[start:start + 2], use_cache=False)
        finally:
            modeling.apply_rotary_pos_emb = original
        for layer in range(3):
            q = torch.cat([c[0] for c in calls[layer::3]]).double()
            k = torch.cat([c[1] for c in calls[layer::3]]).double()
            qk = (q * k.repeat_interleave(2, dim=1)).abs().mean(dim=(0, 2))
            close(ds["importance"][layer].double(), qk, 1e-4, f"layer {layer} importance")
            keys = k.transpose(1, 2).reshape(-1, 2, 16)
            for g in range(2):
                centred = keys[:, g] - keys[:, g].mean(0)
                variance = (centred @ basis[layer, g]).pow(2).mean(0)
                close(variance / variance.sum(), ratio[layer, g].double(), 1e-4,
                      f"layer {layer} KV head {g} explained variance")
        bad = subprocess.run([sys.executable, os.path.join(TOOLS, "calibrate_channels.py"),
                              "--model", model, "--corpus", corpus, "--which", "quest"],
                             capture_output=True, text=True)
        check(bad.returncode != 0 and "--which: expected loki, doublesparsity" in bad.stderr,
              f"bad --which: {bad.stderr[-500:]}")


def check_fixture_current(tool, fixture):
    """The committed tests/fixtures/FIXTURE/reference.json is exactly what tools/TOOL writes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reference.json")
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, tool), "--out", out],
                              capture_output=True, text=True)
        check(proc.returncode == 0, f"{tool} failed:\n{proc.stderr}")
        committed = os.path.join(ROOT, "tests", "fixtures", fixture, "reference.json")
        with open(out) as a, open(committed) as b:
            check(a.read() == b.read(), f"the committed {fixture} fixture is stale: rerun {tool}")


@test
def approx_logit_fixture_is_current():
    """tests/fixtures/approx_logits/reference.json is what make_approx_logit_fixtures.py writes."""
    check_fixture_current("make_approx_logit_fixtures.py", "approx_logits")


@test
def rocketkv_fixture_is_current():
    """tests/fixtures/rocketkv/reference.json is what make_rocketkv_fixture.py writes."""
    check_fixture_current("make_rocketkv_fixture.py", "rocketkv")


@test
def twilight_fixture_is_current():
    """tests/fixtures/twilight/reference.json is what twilight_reference.py writes."""
    check_fixture_current("twilight_reference.py", "twilight")


@test
def magicpig_fixture_is_current():
    """tests/fixtures/magicpig/reference.json is what magicpig_reference.py writes."""
    check_fixture_current("magicpig_reference.py", "magicpig")


@test
def real_model_results_toy_cpu():
    """tools/real_model_results.sh on the demo model at toy size (2 samples, 64 perplexity
    tokens, a stand-in for the paper's pools): every policy and sparsity in each task's table,
    hit rates where the policy scores, and the tables maker's gaps (a task not run, a failed
    eval) said in the file."""
    cli = kvlens_cli()
    if not cli:
        print("  (skipped: no kvlens-cli; build it or set KVLENS_CLI)")
        return
    shared = ARGS.shared_dir
    if not os.path.exists(os.path.join(shared, "data", "eval", "wikitext2-test.txt")):
        print(f"  (skipped: no {shared}/data/eval/wikitext2-test.txt)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pools = paper_pools_stand_in(os.path.join(tmp, "paper-pools.json"))
        out = os.path.join(tmp, "results")
        proc = subprocess.run(
            [os.path.join(TOOLS, "real_model_results.sh"), "--cli", cli, "--model",
             os.path.join(ROOT, "assets", "models", "demo"), "--paper-pools", pools,
             "--samples", "2", "--ppl-tokens", "64", "--jobs", "2", "--threads", "1",
             "--shared", shared, "--out", out], capture_output=True, text=True)
        check(proc.returncode == 0, f"real_model_results.sh failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(out, "results.md")) as f:
            md = f.read()
        check(md in proc.stdout, "the markdown is not printed")
        registry = json.loads(subprocess.run([cli, "policies", "--json"], capture_output=True,
                                             text=True, check=True).stdout)
        policies = [p["id"] for p in registry if not p.get("composed")]
        sections = md.split("\n### ")
        titles = ["Perplexity on WikiText-2 test", "Perplexity on the held-back C4 text",
                  "Co-reference on the bundled pools",
                  "Co-reference on the TokenButler paper's pools"]
        for title in titles:
            section = next((s for s in sections if s.startswith(title)), None)
            check(section is not None, f"no section {title}")
            check("| policy | 30% | 50% | 70% | 90% |" in section, f"{title}: sparsity columns")
            rows = {line.split(" | ")[0][2:]: line for line in section.splitlines()
                    if line.startswith("| ") and not line.startswith("| policy")
                    and not line.startswith("| ---")}
            for policy in policies:
                name = policy + (" (reference)" if policy == "dense" else "")
                check(name in rows, f"{title}: no row for {policy}")
                check(rows[name].count(" | ") == 4, f"{title}: {rows[name]}")
            check(rows["tokenbutler"].count("(eff 0.") == 4 and "hit 0." in rows["tokenbutler"],
                  f"{title}: {rows['tokenbutler']}")
            check(rows["oracle"].count("hit 1.00") == 4, f"{title}: {rows['oracle']}")
            check("- 50%: " in section, f"{title}: no order at 50%")
        check("### At 50% sparsity" in md, "no summary table")
        for fact in ("- Model:", "- Backend: cpu", "- CPU:", "- Wall time of the last invocation:", "```sh",
                     "kvlens-cli eval --model"):
            check(fact in md, f"no {fact!r}")
        runs = os.path.join(out, "runs")
        check(os.path.getsize(os.path.join(runs, "c4-heldout.txt")) > 1000, "held-out C4 text")
        # --resume reruns only the evals whose command changed (here the paper's sample count).
        proc = subprocess.run(
            [os.path.join(TOOLS, "real_model_results.sh"), "--cli", cli, "--model",
             os.path.join(ROOT, "assets", "models", "demo"), "--paper-pools", pools,
             "--samples", "2", "--paper-samples", "1", "--ppl-tokens", "64", "--jobs", "2",
             "--threads", "1", "--shared", shared, "--out", out, "--resume"],
            capture_output=True, text=True)
        check(proc.returncode == 0, f"--resume failed:\n{proc.stderr[-3000:]}")
        check(proc.stderr.count("kept from the earlier run (--resume)") == 12, proc.stderr)
        check(proc.stderr.count("coref_paper at ") == 4 and "exit 0" in proc.stderr, proc.stderr)
        with open(os.path.join(out, "runs", "coref_paper_0.5.json")) as f:
            check(all(r["samples"] == 1 for r in json.load(f)["results"]), "paper samples")
        # The tables maker alone: a task not run and a failed eval are said, not hidden.
        for name in os.listdir(runs):
            if name.startswith("coref_paper_"):
                os.remove(os.path.join(runs, name))
        with open(os.path.join(runs, "c4_0.7.time"), "w") as f:
            f.write("c4\t0.7\t1.0\t1\n")
        with open(os.path.join(runs, "c4_0.7.log"), "w") as f:
            f.write("kvlens-cli: error: something broke\n")
        import real_model_tables as rmt
        again = os.path.join(tmp, "again.md")
        rmt.main(["tables", "--runs", runs, "--out", again])
        with open(again) as f:
            md = f.read()
        check("Not run: no `--paper-pools` file" in md, "the missing task is not said")
        check("| failed |" in md and "kvlens-cli: error: something broke" in md, "failure")
        check(rmt.select_policies(os.path.join(runs, "policies.json"), 0, "") ==
              [p["id"] for p in registry
               if not p.get("needs_predictor") and not p.get("composed")],
              "no predictor, no composed ids unless named")


@test
def train_duo_gates_toy_cpu():
    """tools/train_duo_gates.py on a tiny random Llama: gates [layers, kv_heads] in [0, 1] with
    the recipe in the metadata, identical files from two runs, the L1 term pulling gates below
    their start, and a clear error for a bad argument."""
    from safetensors import safe_open
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
        model = tiny_llama(os.path.join(tmp, "model"), seed=5, vocab=8192, tokenizer=tokenizer)
        data = training_data(tmp, ARGS.shared_dir)
        outs = []
        for run in ("a", "b"):
            out = os.path.join(tmp, f"{run}.safetensors")
            proc = subprocess.run(
                [sys.executable, os.path.join(TOOLS, "train_duo_gates.py"), "--model", model,
                 "--data", *data, "--out", out, "--seq-len", "96", "--steps", "4",
                 "--num-passkeys", "1", "--sink-tokens", "2", "--recent-tokens", "8",
                 "--reg", "5", "--haystack-tokens", "4000"],
                capture_output=True, text=True)
            check(proc.returncode == 0, f"train_duo_gates.py failed:\n{proc.stderr[-3000:]}")
            outs.append(out)
        with open(outs[0], "rb") as a, open(outs[1], "rb") as b:
            check(a.read() == b.read(), "two runs with one seed wrote different files")
        with safe_open(outs[0], "pt") as f:
            gates = f.get_tensor("gates")
            recipe = json.loads(f.metadata()["recipe"])
        check(tuple(gates.shape) == (3, 2) and gates.dtype == torch.float32,
              f"gates {tuple(gates.shape)} {gates.dtype}")
        check(bool(((gates >= 0) & (gates <= 1)).all()), "a gate outside [0, 1]")
        check(float(gates.max()) < 1.0, "the L1 term moved no gate below its start of 1")
        check(recipe["sink_tokens"] == 2 and recipe["recent_tokens"] == 8, f"recipe {recipe}")
        proc = subprocess.run(
            [sys.executable, os.path.join(TOOLS, "train_duo_gates.py"), "--model", model,
             "--data", *data, "--num-passkeys", "11"], capture_output=True, text=True)
        check(proc.returncode != 0 and "--num-passkeys: expected at most 10" in proc.stderr,
              f"bad --num-passkeys: {proc.stderr[-500:]}")


@test
def seer_gate_training_runs_and_is_deterministic():
    """tools/train_seer_gate.py at toy size: two seeded runs write the same gate, of the shapes
    the C++ loader reads; the target is a distribution over the ranked blocks; --init-only."""
    import train_seer_gate as tsg
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = os.path.join(ROOT, "assets", "models", "demo", "tokenizer.json")
        model = tiny_llama(os.path.join(tmp, "model"), seed=9, vocab=8192, tokenizer=tokenizer)
        data = training_data(tmp, ARGS.shared_dir)
        outs = []
        for run in ("a", "b"):
            out = os.path.join(tmp, run)
            cmd = [sys.executable, os.path.join(TOOLS, "train_seer_gate.py"), "--model", model,
                   "--data", *data, "--out", out, "--seq-len", "48", "--steps", "4",
                   "--block-size", "8", "--gate-dim", "4", "--eval-sequences", "2",
                   "--seed", "3", "--doc-chars", "2000"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            check(proc.returncode == 0, f"train_seer_gate.py failed:\n{proc.stderr[-3000:]}")
            outs.append(out)
        blobs = [open(os.path.join(o, "seer_gate.safetensors"), "rb").read() for o in outs]
        check(blobs[0] == blobs[1], "two seeded runs wrote different gates")
        with open(os.path.join(outs[0], "seer_gate.json")) as f:
            info = json.load(f)
        check(info["format"] == "kvlens-seer-gate" and info["block_size"] == 8, str(info))
        check(0.0 <= info["training"]["heldout"]["block_hit_rate"] <= 1.0, "hit rate range")
        tensors = load_file(os.path.join(outs[0], "seer_gate.safetensors"))
        G, H, D, d = info["kv_heads"], info["heads"], info["head_dim"], info["gate_dim"]
        for l in range(info["layers"]):
            check(tuple(tensors[f"layers.{l}.q_proj.weight"].shape) == (G, d, H // G * D),
                  "q_proj shape")
            check(tuple(tensors[f"layers.{l}.k_max_proj.weight"].shape) == (G, d, D), "k_max")
            check(tuple(tensors[f"layers.{l}.k_norm.weight"].shape) == (G, d), "k_norm")
        # The target: per row, a distribution over the blocks that ended before the query.
        torch.manual_seed(0)
        q, k = torch.randn(1, 4, 24, 8), torch.randn(1, 2, 24, 8)
        target = tsg.block_target(q, k, 4, 2)
        ranked = tsg.ranked_blocks(24, 4, "cpu")
        sums = target.sum(-1)[0, :, ranked.sum(-1) > 0]
        check(torch.allclose(sums, torch.ones_like(sums)), "target rows sum to 1")
        check(bool((target[0, :, ~ranked] == 0).all()), "unranked blocks get no target")
        init = os.path.join(tmp, "init")
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, "train_seer_gate.py"),
                               "--model", model, "--init-only", "--out", init, "--block-size",
                               "4"], capture_output=True, text=True)
        check(proc.returncode == 0 and os.path.exists(os.path.join(init, "seer_gate.json")),
              f"--init-only failed:\n{proc.stderr[-2000:]}")
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, "train_seer_gate.py"),
                               "--model", model, "--out", init], capture_output=True, text=True)
        check(proc.returncode != 0 and "--data" in proc.stderr, "no --data must be refused")


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared-dir", default=os.environ.get("KVLENS_SHARED_DIR",
                                                          os.path.join(ROOT, "..", "shared")))
    p.add_argument("-k", default="", help="run the tests whose name contains this")
    p.add_argument("--shard", default="1/1", metavar="K/N",
                   help="run every N-th test from the K-th (ctest runs the shards side by side)")
    ARGS = p.parse_args()
    shard, shards = (int(x) for x in ARGS.shard.split("/"))
    if not 1 <= shard <= shards:
        p.error(f"--shard {ARGS.shard}: want K/N with 1 <= K <= N")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    failed = 0
    for index, fn in enumerate(TESTS):
        if ARGS.k not in fn.__name__ or index % shards != shard - 1:
            continue
        start = time.time()
        try:
            fn()
            print(f"ok    {fn.__name__} ({time.time() - start:.1f}s)", flush=True)
        except Exception:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL  {fn.__name__} ({time.time() - start:.1f}s)", flush=True)
            traceback.print_exc()
    print(f"{failed} failed" if failed else "all passed")
    sys.exit(1 if failed else 0)


ARGS = None
if __name__ == "__main__":
    main()
