"""
Foreign weights: a Hugging Face causal-LM folder as a GPT (model.py, which knows nothing of this file).

    from discoloop.pretrained import from_pretrained
    model = from_pretrained("data/smollm2/out", recurrence="disco", n_loop=2)   # SmolLM2's stack, looped twice

Supported (PRETRAINED, at the end): model_type 'gpt2' (Conv1D weights transposed, learned positions, LayerNorm,
GELU tanh = gelu_new) and the Llama family 'llama' (SmolLM2), 'qwen2' (q, k, v biases): RMSNorm, RoPE (Hugging
Face's rotate_half is model.apply_rope: the weights load as they are), grouped-query attention (n_kv_head), SwiGLU
(gate and up fused into c_fc), an untied head when tie_word_embeddings is false. The logits equal transformers' own
(tests/test_pretrained.py). Weights: model.safetensors, sharded safetensors (model.safetensors.index.json) or
pytorch_model.bin[.index.json], read with weights_only (pickled objects are refused, never run).

The folder decides its architecture: every GPTConfig key but CONTINUE_KEYS. A caller that sets an architecture key
to another value (train.py: the command line, `--init_from=<folder>`; a config file's values give way) is a one-line
ConfigError naming both values. A folder that says its head is tied but stores its own lm_head.weight loads untied,
with a warning, as transformers loads it. Every error is a ValueError (common.py's classes), as a library's are. This is the one reader of such a folder (branch.load_branch, eval_harness.py): whatever is
wrong inside it (a missing or unreadable file, JSON of the wrong shape, a truncated or pickled weights file,
weights that do not fit) is a one-line DataError naming the file. Callers catch ValueError.
"""
import math
import os
import sys

import numpy as np
import torch

from discoloop.common import ConfigError, DataError, read_json, weights_fit
from model import ARCH_KEYS, CONTINUE_KEYS, GPT, GPTConfig



def pretrained_architecture(folder):
    """(model_type, {ARCH_KEYS key: value}, its positions (block_size), config.json's path) of a Hugging Face folder.
    One-line errors for what is not there, not supported, or not a valid model."""
    if not os.path.isdir(folder):
        raise DataError(f"no pretrained model folder at '{folder}'")
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise DataError(f"'{path}' not found: not a Hugging Face model folder")
    hf = read_json(path)
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if (not isinstance(kind, str) or kind not in PRETRAINED or not isinstance(archs, list)
            or any(a not in PRETRAINED[kind][0] for a in archs)):
        export = " (an export_hf.py folder: read the checkpoint it was exported from)" if kind == "discoloop" else ""
        raise DataError(f"{path}: model_type={kind!r} (architectures {archs}) is not supported{export}: supported "
                        f"{', '.join(f'{k} ({a[0]})' for k, a in PRETRAINED.items())}")
    arch = PRETRAINED[kind][1](hf, path)
    n_pos = arch.pop("block_size")
    try:  # the folder's own values (n_head dividing n_embd, ...), before a caller adds its keys
        GPTConfig(**arch, block_size=n_pos, recurrence="loop", n_loop=1)
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None
    weights_fit({**arch, "block_size": n_pos}, path, DataError)  # before anything is built (positions are block_size)
    return kind, arch, n_pos, path


def from_pretrained(folder, **overrides):
    """A Hugging Face causal-LM folder as a GPT, float32, in eval mode; `model.pretrained_fresh` names the weights
    the folder has not (DiscoLoop's ln_inj and gate). overrides: GPTConfig keys, CONTINUE_KEYS freely (default
    recurrence='loop', n_loop=1: the model as it was trained; 'none' gets K copies of the stack; a shorter
    block_size), an architecture key only at the folder's value."""
    kind, arch, n_pos, path = pretrained_architecture(folder)
    bad = [k for k in overrides if k not in GPTConfig.defaults()]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a GPTConfig key")
    fixed = [k for k in overrides if k in arch and overrides[k] != arch[k]]
    if fixed:
        k = fixed[0]
        raise ConfigError(f"{k}={overrides[k]!r} conflicts with {path}, which has {k}={arch[k]!r}: the folder decides "
                          f"its architecture (a continuation may set {', '.join(CONTINUE_KEYS)})")
    sd, files = read_hf_weights(folder)
    if arch["tie_embeddings"] and stores_own_head(sd, kind):  # as transformers loads it: untied, with its warning
        print(f"warning: {path} says tie_word_embeddings=true, but {files} stores its own lm_head.weight, unlike the "
              "embedding: loaded untied, as transformers does (set tie_word_embeddings=false there to silence this)",
              file=sys.stderr)
        arch["tie_embeddings"] = False
        if overrides.get("tie_embeddings") is True:
            raise ConfigError(f"tie_embeddings=True conflicts with {files}, which stores its own head (untied)")
    config = GPTConfig(**{"recurrence": "loop", "n_loop": 1, "block_size": n_pos, **arch, **overrides})
    if config.pos_emb == "learned" and config.block_size > n_pos:
        raise ConfigError(f"block_size={config.block_size} is more than the {n_pos} learned positions of {path}")
    try:
        ours = PRETRAINED[kind][2](sd, config, files)  # one stack of n_layer blocks, our names and layout
    except RuntimeError as e:  # torch.cat of q, k, v (gate, up) rows of shapes that do not fit together
        raise DataError(f"{files}: weights that do not fit {path} ({str(e).splitlines()[0][:120]})") from None
    return _load(config, ours, files, path)


def stores_own_head(sd, kind):
    """Whether a folder's weights hold an lm_head.weight that is not its embedding (transformers then unties them)."""
    head, name = sd.get("lm_head.weight"), {"gpt2": "wte.weight"}.get(kind, "embed_tokens.weight")
    emb = sd.get(name, sd.get(("transformer." if kind == "gpt2" else "model.") + name))
    return head is not None and emb is not None and (head.shape != emb.shape or not torch.equal(head, emb))


def _load(config, ours, files, path):
    """The GPT of config holding the converted weights: each must fit its place; only a recurrence's new weights
    (DiscoLoop's ln_inj and gate) may be missing, and a tied head. Checked on shapes alone
    before the model is made: a config.json may claim a far larger model than its weights."""
    if "transformer.wpe.weight" in ours:
        ours["transformer.wpe.weight"] = ours["transformer.wpe.weight"][:config.block_size]
    blocks = len({k.split(".")[2] for k in ours if k.startswith("transformer.h.")})  # counted before building any
    if blocks != config.n_layer:
        raise DataError(f"{path}: n_layer={config.n_layer} (its layer count) but {files} holds {blocks} blocks: the "
                        "config does not describe the weights")
    with torch.device("meta"):
        shapes = GPT(config)
    full = _tile_copies(ours, config.n_layer, config.n_loop if shapes.rec.copies else 1)
    want = {k: v for k, v in shapes.state_dict().items() if not (k == "lm_head.weight" and config.tie_embeddings)}
    for name, t in full.items():
        if name not in want or want[name].shape != t.shape:
            raise DataError(f"{files}: weight for {name} has shape {tuple(t.shape)}, the model built from "
                            f"{path} wants {tuple(want[name].shape) if name in want else 'none'}")
    fresh = sorted(k for k in want if k not in full)
    new = [m for m in fresh if not m.startswith(("transformer.ln_inj.", "gate_"))]
    if new:
        raise DataError(f"{files} has no weight for {new[0]} ({len(new)} missing)")
    model = GPT(config)
    model.load_state_dict(full, strict=False)
    model.pretrained_fresh = fresh
    return model.eval()


def _tile_copies(ours, n, copies):
    """One stack's weights for every untied copy (recurrence='none': each copy starts as the pretrained stack)."""
    full = {}
    for name, t in ours.items():
        if name.startswith("transformer.h."):
            i, rest = name[len("transformer.h."):].split(".", 1)
            full.update({f"transformer.h.{c * n + int(i)}.{rest}": t for c in range(copies)})
        else:
            full[name] = t
    return full


def read_hf_weights(folder):
    """{name: tensor} of a Hugging Face folder's weights and the file(s) they came from (for messages)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        path = os.path.join(folder, index)
        if os.path.isfile(path):
            names = read_json(path).get("weight_map")
            if not isinstance(names, dict) or not names or not all(
                    isinstance(n, str) and n and os.path.basename(n) == n for n in names.values()):
                raise DataError(f"'{path}' has no weight_map of file names in its folder")
            shards = sorted(set(names.values()))
            break
    else:
        shards = [n for n in ("model.safetensors", "pytorch_model.bin") if os.path.isfile(os.path.join(folder, n))][:1]
        if not shards:
            raise DataError(f"no weights in '{folder}': expected model.safetensors, "
                            "model.safetensors.index.json or pytorch_model.bin")
    sd = {}
    for name in shards:
        sd.update(read_weights_file(os.path.join(folder, name)))
    return sd, os.path.join(folder, shards[0]) if len(shards) == 1 else f"{folder} ({len(shards)} shards)"


def read_weights_file(path):
    """{name: tensor} of one .safetensors or pytorch_model.bin file; one line naming it when it is missing,
    truncated, of another format, or (a .bin) holds pickled objects other than tensors."""
    if not os.path.isfile(path):
        raise DataError(f"weights file '{path}' (named by the index) not found")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file
            sd = load_file(path)
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' and torch's errors for truncated, foreign or code-carrying files
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "weights_only" in first or "Weights only load failed" in first:  # never advise weights_only=False
            first = "it holds pickled objects other than plain tensors, which are refused"
        raise DataError(f"'{path}' is not a readable weights file ({os.path.getsize(path)} bytes; "
                        f"{first[:200]})") from None
    if not isinstance(sd, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in sd.items()):
        raise DataError(f"'{path}' holds no {{name: tensor}} state dict")
    ints = [k for k, v in sd.items() if not v.is_floating_point() and not k.endswith(("inv_freq", "attn.bias", "masked_bias"))]
    if ints:  # quantized or corrupt: loading would cast them to float without a word
        raise DataError(f"'{path}': weight {ints[0]!r} is {sd[ints[0]].dtype}, allowed floating-point weights "
                        "(a quantized checkpoint is not supported)")
    return sd


def _hf_get(hf, key, path, default=None, kind=int):
    """config.json's value of key (default when absent or null), of the kind the model needs: an int >= 1 (>= 0
    where the default is 0), a bool, or a finite float read as the shortest decimal of its float32 value (the model
    computes it in float32, and a folder converted from GGUF's float32 metadata says 9.999999747378752e-06 for
    1e-05: the value a config file states). One line naming the file for a missing or mistyped value."""
    v = hf.get(key)
    if v is None:
        if default is None:
            raise DataError(f"{path} has no {key!r}")
        v = default
    if kind is float and type(v) in (int, float) and math.isfinite(v):
        return float(str(np.float32(v)))
    if kind is bool and type(v) is bool or kind is int and type(v) is int and v >= (0 if default == 0 else 1):
        return v
    allowed = {float: "a finite number", bool: "true or false", int: f"an integer >= {0 if default == 0 else 1}"}
    raise DataError(f"{path}: {key}={v!r} is invalid: allowed {allowed[kind]}")


def _hf_require(ok, what, path):
    if not ok:
        raise DataError(f"{path}: {what} is not supported by from_pretrained")


def _gpt2_config(hf, path):
    act = hf.get("activation_function", "gelu_new")
    _hf_require(act in ("gelu_new", "gelu_pytorch_tanh"), f"activation_function={act!r} (ours: GELU tanh)", path)
    _hf_require(hf.get("scale_attn_weights", True), "scale_attn_weights=false", path)
    _hf_require(not hf.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx=true", path)
    _hf_require(_hf_get(hf, "tie_word_embeddings", path, True, bool), "an untied GPT-2 head", path)
    return dict(block_size=_hf_get(hf, "n_positions", path), vocab_size=_hf_get(hf, "vocab_size", path),
                n_layer=_hf_get(hf, "n_layer", path), n_head=_hf_get(hf, "n_head", path),
                n_embd=_hf_get(hf, "n_embd", path), n_kv_head=0, n_hidden=_hf_get(hf, "n_inner", path, 0),
                pos_emb="learned", rope_theta=GPTConfig.rope_theta, sandwich_norm=False, norm="layernorm",
                mlp="gelu", bias=True, qkv_bias=False, tie_embeddings=True,
                norm_eps=_hf_get(hf, "layer_norm_epsilon", path, 1e-5, float))


def _gpt2_weights(sd, config, files):
    """GPT-2's names are ours (nanoGPT's), under 'transformer.' or not; Conv1D stores (in, out): transposed."""
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}  # old mask buffers
    head = sd.pop("lm_head.weight", None)  # tied to wte, unless the folder stores its own (from_pretrained unties)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    ours = {f"transformer.{k}": v.t() if k.endswith(conv1d) else v for k, v in sd.items()}
    if not config.tie_embeddings:
        ours["lm_head.weight"] = head
    blocks = [k.split(".") for k in ours if k.startswith("transformer.h.")]
    extra = [".".join(p) for p in blocks if len(p) < 5 or not p[2].isdigit() or int(p[2]) >= config.n_layer]
    if extra:
        raise DataError(f"{files} has weights outside blocks 0..{config.n_layer - 1}: {extra[0]}")
    return ours


def _llama_config(hf, path):
    for key in ("rope_parameters", "rope_scaling"):  # transformers 5 / 4: either may carry a scaling
        r = hf.get(key) or {}
        kind = r.get("rope_type", r.get("type", "default")) if isinstance(r, dict) else "default"
        _hf_require(kind == "default", f"{key} with rope_type={kind!r} (ours: plain RoPE)", path)
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise DataError(f"{path}: rope_parameters={rope!r} is invalid: allowed an object")
    theta = _hf_get({"rope_theta": hf.get("rope_theta"), **rope}, "rope_theta", path, 10000.0, float)
    _hf_require(hf.get("hidden_act", "silu") == "silu", f"hidden_act={hf.get('hidden_act')!r} (ours: SwiGLU)", path)
    _hf_require(not hf.get("attention_bias", False), "attention_bias=true (o_proj bias)", path)
    _hf_require(not hf.get("mlp_bias", False), "mlp_bias=true", path)
    _hf_require(not hf.get("use_sliding_window", False), "use_sliding_window=true", path)
    d, heads = _hf_get(hf, "hidden_size", path), _hf_get(hf, "num_attention_heads", path)
    head_dim = _hf_get(hf, "head_dim", path, d // heads or 1)
    _hf_require(head_dim * heads == d, f"head_dim={head_dim} with hidden_size={d} and {heads} heads", path)
    return dict(block_size=_hf_get(hf, "max_position_embeddings", path), vocab_size=_hf_get(hf, "vocab_size", path),
                n_layer=_hf_get(hf, "num_hidden_layers", path), n_head=heads, n_embd=d,
                n_kv_head=_hf_get(hf, "num_key_value_heads", path, heads), n_hidden=_hf_get(hf, "intermediate_size", path),
                pos_emb="rope", rope_theta=theta, sandwich_norm=False, norm="rmsnorm", mlp="swiglu", bias=False,
                qkv_bias=hf["model_type"] == "qwen2", tie_embeddings=_hf_get(hf, "tie_word_embeddings", path, False, bool),
                norm_eps=_hf_get(hf, "rms_norm_eps", path, 1e-6, float))


def _llama_weights(sd, config, files):
    """Llama/Qwen2 (under 'model.' or not): q, k, v rows fused into c_attn, gate and up into c_fc, in our order."""
    sd = {k[len("model."):] if k.startswith("model.") else k: v for k, v in sd.items() if not k.endswith("inv_freq")}
    head = sd.pop("lm_head.weight", None)

    def take(k):
        if k not in sd:
            raise DataError(f"{files} has no weight {k!r}")
        return sd.pop(k)

    ours = {"transformer.wte.weight": take("embed_tokens.weight"), "transformer.ln_f.weight": take("norm.weight")}
    if not config.tie_embeddings:
        if head is None:
            raise DataError(f"{files} has no 'lm_head.weight' (tie_word_embeddings is false)")
        ours["lm_head.weight"] = head
    for i in range(config.n_layer):
        a, o = f"layers.{i}.", f"transformer.h.{i}."
        ours[o + "attn.c_attn.weight"] = torch.cat([take(a + f"self_attn.{p}_proj.weight") for p in "qkv"])
        if config.qkv_bias:
            ours[o + "attn.c_attn.bias"] = torch.cat([take(a + f"self_attn.{p}_proj.bias") for p in "qkv"])
        ours[o + "attn.c_proj.weight"] = take(a + "self_attn.o_proj.weight")
        ours[o + "mlp.c_fc.weight"] = torch.cat([take(a + "mlp.gate_proj.weight"), take(a + "mlp.up_proj.weight")])
        ours[o + "mlp.c_proj.weight"] = take(a + "mlp.down_proj.weight")
        ours[o + "ln_1.weight"] = take(a + "input_layernorm.weight")
        ours[o + "ln_2.weight"] = take(a + "post_attention_layernorm.weight")
    if sd:
        raise DataError(f"{files} has weights from_pretrained does not know: {sorted(sd)[:3]}")
    return ours


# model_type -> (architectures, config.json -> {ARCH_KEYS + block_size: value}, weights -> our state dict of one stack)
PRETRAINED = {
    "gpt2": (("GPT2LMHeadModel", "GPT2Model"), _gpt2_config, _gpt2_weights),
    "llama": (("LlamaForCausalLM", "LlamaModel"), _llama_config, _llama_weights),
    "qwen2": (("Qwen2ForCausalLM", "Qwen2Model"), _llama_config, _llama_weights),
}
