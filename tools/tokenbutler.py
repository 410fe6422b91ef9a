"""The TokenButler predictor in PyTorch (POLICIES.md, "The TokenButler predictor"; on-disk contract in
engine/model/predictor.h), its predictor.safetensors + predictor.json files, and the true attention
logits of a frozen Llama that it is trained against and scored on. Importable module, no CLI.
Shapes: x [B, L, E] (layer-0 attention input) -> q_imp, k_imp [B, N, H, L, d'] (after RoPE);
predicted_logits -> [B, N, H, Lq, Lk]; true_logits -> ([B, L, E], [B, N-1, H, L, L] for layers 1..N-1).
"""

import json
import math
import os
import tempfile

import torch
import torch.nn as nn

FORMAT = "kvlens-tokenbutler-predictor"
FORMAT_VERSION = 1
VARIANTS = ("v1", "hf")
BUTLER_PREFIX = "model.layers.0.self_attn.sparse_token_predictor."
# The reference code forces llama3 scaling on both of the predictor's rotary embeddings, whatever
# the base model uses; kvlens does the same (only rope_theta comes from the base model).
FORCED_ROPE_SCALING = {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1,
                       "high_freq_factor": 4, "original_max_position_embeddings": 8192}


# ----------------------------------------------------------------------------- rotary embeddings

def llama3_inv_freq(dim, theta, scaling=FORCED_ROPE_SCALING):
    """Inverse frequencies [dim/2] (Python floats, float64 math) of llama3-scaled RoPE: wavelengths
    shorter than original/high_freq_factor are kept, longer than original/low_freq_factor divided by
    `factor`, and the band between interpolated smoothly (the same rule transformers applies)."""
    if dim % 2:
        raise ValueError(f"rotary width must be even, got {dim}")
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(dim // 2):
        freq = 1.0 / (float(theta) ** (2 * i / dim))
        wavelen = 2 * math.pi / freq
        if wavelen > low_wavelen:
            freq = freq / factor
        elif wavelen >= high_wavelen:
            smooth = (original / wavelen - low) / (high - low)
            freq = (1 - smooth) * freq / factor + smooth * freq
        out.append(freq)
    return out


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions, inv_freq, dtype, device):
    """positions [B, L] -> cos, sin [B, L, dim] (angles in float64 for float64 inputs, else float32,
    the halves repeated as in the rotate-half convention)."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    inv = torch.tensor(inv_freq, dtype=torch.float64, device=device).to(compute)
    angles = positions.to(device=device, dtype=compute)[..., None] * inv
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------- the predictor

def parameter_count(hidden_size, attn_reduce_factor, heads, layers, dDash, intdim, variant="hf"):
    """Parameters of the predictor's modules: v1 counts its unused norm2, hf adds norm_importance."""
    E, Er = hidden_size, hidden_size // attn_reduce_factor
    count = E * Er + 3 * Er * Er          # input_proj, q/k/v_proj_attn
    count += 2 * Er                       # norm1
    count += Er * 2 * Er + 2 * Er         # ffn.0
    count += 2 * Er * E + E               # ffn.2
    count += 2 * E                        # norm2
    if variant == "hf":
        count += 2 * E                    # norm_importance
    count += 2 * (E * intdim + intdim * layers * heads * dDash)  # q/k_proj_importance
    return count


class PredictorCache:
    """Per-sequence decode cache: the predictor's own attention keys (rotated once, at their own
    positions) and values, and the importance keys [B, N, H, T, d']."""

    def __init__(self):
        self.attn_k = self.attn_v = self.key_positions = self.importance_k = None

    @property
    def length(self):
        return 0 if self.key_positions is None else self.key_positions.shape[-1]

    @staticmethod
    def _cat(old, new, dim):
        return new if old is None else torch.cat((old, new), dim=dim)

    def append_attention(self, k, v, positions):
        self.attn_k = self._cat(self.attn_k, k, 2)
        self.attn_v = self._cat(self.attn_v, v, 2)
        self.key_positions = self._cat(self.key_positions, positions, 1)
        return self.attn_k, self.attn_v, self.key_positions

    def append_importance(self, k):
        self.importance_k = self._cat(self.importance_k, k, 3)
        return self.importance_k


class TokenButlerPredictor(nn.Module):
    """One predictor for all layers and heads of a base model with hidden size E, H query heads and
    N layers. Module names are those of the reference state dict."""

    def __init__(self, hidden_size, heads, layers, attn_reduce_factor=8, dDash=16, intdim=512,
                 variant="hf", rope_theta=10000.0, layer_norm_eps=1e-5, dropout=0.1):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if hidden_size % attn_reduce_factor:
            raise ValueError(f"hidden size {hidden_size} not divisible by attn_reduce_factor "
                             f"{attn_reduce_factor}")
        reduced = hidden_size // attn_reduce_factor
        if reduced % heads or (reduced // heads) % 2:
            raise ValueError(f"reduced size {reduced} must split into {heads} heads of even width")
        if dDash % 2:
            raise ValueError(f"dDash must be even, got {dDash}")
        self.hidden_size, self.heads, self.layers = hidden_size, heads, layers
        self.attn_reduce_factor, self.reduced_size = attn_reduce_factor, reduced
        self.attn_head_dim = reduced // heads
        self.dDash, self.intdim, self.variant = dDash, intdim, variant
        self.rope_theta, self.layer_norm_eps = float(rope_theta), float(layer_norm_eps)
        self.attn_inv_freq = llama3_inv_freq(self.attn_head_dim, self.rope_theta)
        self.importance_inv_freq = llama3_inv_freq(dDash, self.rope_theta)

        self.input_proj = nn.Linear(hidden_size, reduced, bias=False)
        self.q_proj_attn = nn.Linear(reduced, reduced, bias=False)
        self.k_proj_attn = nn.Linear(reduced, reduced, bias=False)
        self.v_proj_attn = nn.Linear(reduced, reduced, bias=False)
        self.norm1 = nn.LayerNorm(reduced, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # applied in hf only
        self.ffn = nn.Sequential(nn.Linear(reduced, 2 * reduced), nn.GELU(),
                                 nn.Linear(2 * reduced, hidden_size), nn.Dropout(dropout))
        if variant == "hf":
            self.norm_importance = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        slots = layers * heads * dDash
        self.q_proj_importance = nn.Sequential(nn.Linear(hidden_size, intdim, bias=False), nn.SiLU(),
                                               nn.Linear(intdim, slots, bias=False))
        self.k_proj_importance = nn.Sequential(nn.Linear(hidden_size, intdim, bias=False), nn.SiLU(),
                                               nn.Linear(intdim, slots, bias=False))
        self.reset_parameters()

    def reset_parameters(self):
        """The reference initialisation: Xavier-uniform Linear weights, zero biases, LayerNorm 1/0."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def config_dict(self):
        """The size fields of predictor.json."""
        return {"variant": self.variant, "hidden_size": self.hidden_size,
                "attn_reduce_factor": self.attn_reduce_factor, "heads": self.heads,
                "layers": self.layers, "dDash": self.dDash, "intdim": self.intdim,
                "layer_norm_eps": self.layer_norm_eps, "rope_theta": self.rope_theta,
                "rope_scaling": dict(FORCED_ROPE_SCALING)}

    def forward(self, x, positions=None, cache=None):
        """x [B, L, E] -> (q_imp [B, N, H, L, d'], k_imp [B, N, H, T, d']) where T = L without a
        cache, else every token seen so far. Each token is rotated once, at its own position; a
        query sees the keys at positions <= its own."""
        B, L, _ = x.shape
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + L, device=x.device)
        positions = positions.to(x.device).long()
        if positions.dim() == 1:
            positions = positions[None].expand(B, L)
        H, hd, N, dd = self.heads, self.attn_head_dim, self.layers, self.dDash

        reduced = self.input_proj(x)
        q = self.q_proj_attn(reduced).view(B, L, H, hd)
        k = self.k_proj_attn(reduced).view(B, L, H, hd)
        v = self.v_proj_attn(reduced).view(B, L, H, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.attn_inv_freq, x.dtype, x.device)
        q = apply_rope(q, cos[:, :, None], sin[:, :, None]).transpose(1, 2)  # [B, H, L, hd]
        k = apply_rope(k, cos[:, :, None], sin[:, :, None]).transpose(1, 2)
        key_positions = positions
        if cache is not None:
            k, v, key_positions = cache.append_attention(k, v, positions)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
        future = key_positions[:, None, None, :] > positions[:, None, :, None]
        scores = scores.masked_fill(future, float("-inf"))
        attended = torch.matmul(torch.softmax(scores, dim=-1), v)
        attended = attended.transpose(1, 2).reshape(B, L, self.reduced_size)
        hidden = x + self.ffn(self.norm1(attended))
        if self.variant == "hf":
            hidden = self.norm_importance(self.norm2(hidden))

        # Output channels viewed [H, N, d']: layer l, head h reads [(h*N + l)*d', (h*N + l + 1)*d').
        q_imp = self.q_proj_importance(hidden).view(B, L, H, N, dd)
        k_imp = self.k_proj_importance(hidden).view(B, L, H, N, dd)
        cos, sin = rope_cos_sin(positions, self.importance_inv_freq, x.dtype, x.device)
        cos, sin = cos[:, :, None, None], sin[:, :, None, None]
        q_imp = apply_rope(q_imp, cos, sin).permute(0, 3, 2, 1, 4)  # [B, N, H, L, d']
        k_imp = apply_rope(k_imp, cos, sin).permute(0, 3, 2, 1, 4)
        if cache is not None:
            k_imp = cache.append_importance(k_imp)
        return q_imp, k_imp


def predicted_logits(q_imp, k_imp):
    """q_imp [.., Lq, d'], k_imp [.., Lk, d'] -> q.k^T / sqrt(d') [.., Lq, Lk]."""
    return torch.matmul(q_imp, k_imp.transpose(-1, -2)) / math.sqrt(q_imp.shape[-1])


# ----------------------------------------------------------------------------- files

def _write_json_atomic(path, obj):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def save_state_dict(state, path):
    """Tensors as F32, contiguous, on the CPU, into a safetensors file (written atomically)."""
    from safetensors.torch import save_file
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous().clone()
               for name, t in state.items()}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".safetensors")
    os.close(fd)
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def predictor_json(module, base_model_info, training_info):
    info = {"format": FORMAT, "version": FORMAT_VERSION}
    info.update(module.config_dict())
    info["parameters"] = sum(p.numel() for p in module.state_dict().values())
    info["base_model"] = base_model_info or {}
    info["training"] = training_info or {}
    return info


def save_predictor(module, out_dir, base_model_info=None, training_info=None):
    """Writes out_dir/predictor.safetensors (state-dict names, F32) and out_dir/predictor.json."""
    os.makedirs(out_dir, exist_ok=True)
    save_state_dict(module.state_dict(), os.path.join(out_dir, "predictor.safetensors"))
    info = predictor_json(module, base_model_info, training_info)
    _write_json_atomic(os.path.join(out_dir, "predictor.json"), info)
    return info


def load_predictor(path, map_location="cpu"):
    """A predictor folder, or its predictor.safetensors / predictor.json -> TokenButlerPredictor
    (eval mode, F32) with the json document as `.info`."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    json_path = os.path.join(folder, "predictor.json")
    st_path = path if path.endswith(".safetensors") else os.path.join(folder, "predictor.safetensors")
    with open(json_path) as f:
        info = json.load(f)
    if info.get("format") != FORMAT or info.get("version") != FORMAT_VERSION:
        raise ValueError(f"{json_path}: not a {FORMAT} version {FORMAT_VERSION} file")
    module = TokenButlerPredictor(
        hidden_size=info["hidden_size"], heads=info["heads"], layers=info["layers"],
        attn_reduce_factor=info["attn_reduce_factor"], dDash=info["dDash"],
        intdim=info["intdim"], variant=info["variant"], rope_theta=info["rope_theta"],
        layer_norm_eps=info.get("layer_norm_eps", 1e-5))
    from safetensors.torch import load_file
    state = {k: v.float() for k, v in load_file(st_path, device=str(map_location)).items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{st_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    module.info = info
    return module.eval()


# ----------------------------------------------------------------------------- base model

def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def config_rope_theta(config):
    """rope_theta of a config.json dict: transformers 5 nests it in rope_parameters, 4.x has it at
    the top level."""
    for key in ("rope_parameters", "rope_scaling"):
        nested = config.get(key)
        if isinstance(nested, dict) and "rope_theta" in nested:
            return float(nested["rope_theta"])
    return float(config.get("rope_theta", 10000.0))


def base_model_info(model_dir, config=None):
    """Provenance of the base model for predictor.json."""
    config = config or read_config(model_dir)
    heads = config["num_attention_heads"]
    return {"path": os.path.abspath(model_dir), "name": os.path.basename(os.path.abspath(model_dir)),
            "model_type": config.get("model_type"), "hidden_size": config["hidden_size"],
            "num_hidden_layers": config["num_hidden_layers"], "num_attention_heads": heads,
            "num_key_value_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "rope_theta": config_rope_theta(config),
            "max_position_embeddings": config.get("max_position_embeddings")}


def load_base_model(model_dir, device="cpu", attn_implementation=None):
    """A frozen LlamaForCausalLM-compatible model in F32, eval mode. llama_butler checkpoints are
    read as plain Llama (their predictor weights are ignored with a warning)."""
    import transformers
    config = read_config(model_dir)
    kwargs = {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if config.get("model_type") == "llama_butler":
        cfg = transformers.LlamaConfig.from_dict(
            {k: v for k, v in config.items() if k not in ("model_type", "auto_map", "architectures")})
        model = transformers.LlamaForCausalLM.from_pretrained(model_dir, config=cfg, **kwargs)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    model = model.float().to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _decoder(model):
    return model.model if hasattr(model, "model") else model


def _rotary(model, layer, hidden, position_ids):
    rotary = getattr(_decoder(model), "rotary_emb", None)
    if rotary is None:  # older transformers: one rotary embedding per attention module
        rotary = layer.self_attn.rotary_emb
    return rotary(hidden, position_ids)


@torch.no_grad()
def layer_hidden_states(model, input_ids):
    """The input of every decoder layer: a tuple whose entry l is layer l's input [B, L, E]."""
    out = _decoder(model)(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return out.hidden_states


@torch.no_grad()
def layer0_input(model, hidden_states):
    """Layer 0's attention input: its input_layernorm applied to the embeddings."""
    return _decoder(model).layers[0].input_layernorm(hidden_states[0])


@torch.no_grad()
def true_layer_logits(model, hidden_states, layer_idx):
    """q.k / sqrt(head_dim) of one layer after RoPE and GQA expansion, full square, no mask:
    [B, H, L, L]."""
    layer = _decoder(model).layers[layer_idx]
    attn = layer.self_attn
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(attn, "head_dim", None) or config.hidden_size // heads
    h = layer.input_layernorm(hidden_states[layer_idx])
    B, L, _ = h.shape
    position_ids = torch.arange(L, device=h.device)[None].expand(B, L)
    q = attn.q_proj(h).view(B, L, heads, head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(B, L, kv_heads, head_dim).transpose(1, 2)
    cos, sin = _rotary(model, layer, h, position_ids)
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    return torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)


@torch.no_grad()
def true_logits(model, input_ids):
    """-> (layer-0 attention input [B, L, E], true logits of layers 1..N-1 [B, N-1, H, L, L])."""
    hidden = layer_hidden_states(model, input_ids)
    layers = len(_decoder(model).layers)
    logits = torch.stack([true_layer_logits(model, hidden, l) for l in range(1, layers)], dim=1)
    return layer0_input(model, hidden), logits


# ----------------------------------------------------------------------------- scoring

def top_half_agreement(pred, true, min_row=8):
    """pred, true [..., L, L] (query rows, key columns; only keys j <= i count) -> [...] mean over
    rows i >= min_row of the fraction of candidates 0..i whose membership in the predicted top
    ceil((i+1)/2) agrees with the true top ceil((i+1)/2). Ties rank the more recent token first."""
    L = pred.shape[-1]
    idx = torch.arange(L, device=pred.device)
    valid = idx[None, :] <= idx[:, None]
    keep = (idx + 2) // 2

    def members(x):
        flipped = x.masked_fill(~valid, float("-inf")).flip(-1)  # most recent key first
        order = torch.sort(flipped, dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, idx.expand_as(order).contiguous())
        return rank.flip(-1) < keep[:, None]

    agree = ((members(pred) == members(true)) & valid).sum(-1).double() / (idx + 1)
    if L <= min_row:
        return torch.full(pred.shape[:-2], float("nan"), dtype=torch.float64, device=pred.device)
    return agree[..., min_row:].mean(-1)
