"""
Running an export (export_hf.py's folder) in vLLM, the engine people serve and evaluate with: what it refuses, in one
line and before the engine starts (check_export), and starting it (start). eval_harness.py's vLLM backend, the
serving measurements (.ci/serve_measure.py) and the tests start it here; the model class vLLM runs is
vllm_model.py's, registered by the serving extra (requirements-serve.txt). Imports vLLM only inside start().
"""
import json
import os
import struct

from discoloop.common import ConfigError
from discoloop.from_checkpoint import EXIT_KEYS
from discoloop.speculative import SPEC_KEYS
from model import GPT, GPTConfig

INSTALL = "pip install -r requirements-serve.txt && pip uninstall -y torchvision torchaudio torchcodec"
# what export_hf.py writes into config.json besides the GPTConfig fields (and what transformers adds when it saves)
EXPORT_KEYS = {"model_type", "architectures", "auto_map", "trained_n_loop", "max_position_embeddings",
               "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "dtype", "torch_dtype",
               "transformers_version", "discoloop_source"}
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention (cpu_attn.py)


def vllm_missing():
    """'' when vLLM and this repo's plugin are installed, else one line saying how to install them and, where the
    engine's CPU build cannot run on this processor, which instruction set it lacks."""
    try:
        import vllm  # noqa: F401
        from importlib.metadata import entry_points
    except ImportError:
        return f"vLLM is not installed (the serving extra): {INSTALL}"
    if not any(e.name == "discoloop" for e in entry_points(group="vllm.general_plugins")):
        return f"the discoloop plugin for vLLM is not installed: {INSTALL}"
    flags = cpu_flags()
    if flags is not None and not ({"avx512f", "avx2"} & flags):
        return "vLLM's CPU build needs AVX2 or AVX-512 (avx2 / avx512f), which this processor lacks"
    return ""


def cpu_flags():
    """This x86 processor's instruction-set flags (/proc/cpuinfo), or None elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return None
    return set(line.split(":", 1)[1].split()) if line else None


def safetensors_shapes(path):
    """{name: shape} from a safetensors file's header alone (8-byte length, then JSON): no tensor is read."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 1 << 28:
            raise ConfigError(f"'{path}' is not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def check_export(folder, n_loop=None, device="cpu", kv_share=None):
    """The export's config as the engine would build it: one ConfigError line naming the key, before the engine
    starts, for a folder that is not an export, a key the engine cannot honour (an exit rule or speculative key
    written into config.json), a bad value, a head size vLLM's CPU attention refuses, or weights of other sizes than
    the config's. Reads only: no export folder is written to. Returns (the GPTConfig it runs, the loop count);
    kv_share (not None): another of model.KV_SHARES than the export's, as hf_overrides gives it."""
    path = os.path.join(folder, "config.json")
    if os.path.isfile(os.path.join(folder, "ckpt.pt")) or folder.endswith(".pt"):
        raise ConfigError(f"'{folder}' is a training run or checkpoint, not an export: the engine runs an export_hf.py "
                          f"folder (python export_hf.py --ckpt={folder} --out_dir=EXPORT_DIR)")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"'{folder}' is not an export_hf.py folder ({path}: {getattr(e, 'strerror', None) or e})") \
            from None
    if not isinstance(raw, dict) or raw.get("model_type") != "discoloop":
        got = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"'{folder}': model_type={got!r}: vLLM's discoloop model runs export_hf.py's folders "
                          "(model_type 'discoloop'); other models run in vLLM as they are")
    fields = GPTConfig.defaults()
    extra = sorted(k for k in raw if k not in fields and k not in EXPORT_KEYS)
    if extra:
        k = extra[0]
        what = ("adaptive depth is decided per token in model.py's own loop; the engine runs every loop"
                if k.startswith("exit_") else "speculative decoding is model.py's pipelined decoder, not the engine's"
                if k.startswith("spec") else "not a key export_hf.py writes")
        raise ConfigError(f"{path}: {k}={raw[k]!r} cannot run in vLLM ({what}): remove it, or run the export "
                          "with sample.py / transformers")
    trained = raw.get("trained_n_loop", raw.get("n_loop", fields["n_loop"]))
    K = raw.get("n_loop", trained) if n_loop is None else n_loop
    try:
        share = {} if kv_share is None else {"kv_share": kv_share}
        cfg = GPTConfig.from_dict({**fields, **{k: raw[k] for k in fields if k in raw}, "n_loop": trained, **share})
        if not (isinstance(K, int) and K >= 1 and (K <= trained or not cfg.recurrence == "none")
                and (K >= 2 or cfg.recurrence not in ("disco", "ponder"))):
            raise ValueError(f"n_loop={K!r} is invalid: allowed 1..{trained if cfg.recurrence == 'none' else 'any'}"
                             f"{' and >= 2' if cfg.recurrence in ('disco', 'ponder') else ''} for "
                             f"recurrence={cfg.recurrence!r}")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    hs = cfg.n_embd // cfg.n_head
    if device == "cpu" and hs not in CPU_HEAD_SIZES:
        raise ConfigError(f"{path}: n_embd / n_head = {cfg.n_embd} / {cfg.n_head} = head size {hs}: vLLM's CPU "
                          f"attention runs head sizes {list(CPU_HEAD_SIZES)}; run this export with sample.py or "
                          "transformers")
    check_weights(folder, path, cfg)
    return cfg, K


def check_weights(folder, path, cfg):
    """model.safetensors' names and shapes (its header only) against the model cfg builds: one line for the first
    that differs."""
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(weights):
        raise ConfigError(f"'{folder}' has no model.safetensors: export it again with export_hf.py")
    want = {f"gpt.{k}": tuple(v.shape) for k, v in GPT_SHAPES(cfg).items()}
    have = safetensors_shapes(weights)
    for name, shape in have.items():
        if name in want and want[name] != shape:
            raise ConfigError(f"{path} does not fit its weights: {name} is {list(shape)} in model.safetensors, "
                              f"{list(want[name])} for this config (a hand-edited size?)")
        if name not in want:
            raise ConfigError(f"{path} does not fit its weights: model.safetensors holds {name}, which this config "
                              "does not build (a hand-edited recurrence, n_layer or positions?)")
    lacking = sorted(set(want) - set(have) - ({"gpt.lm_head.weight"} if cfg.tie_embeddings else set()))
    if lacking:
        raise ConfigError(f"{path} does not fit its weights: model.safetensors lacks {lacking[0]}")


def GPT_SHAPES(cfg):
    """model.py's parameter shapes for cfg, built on the meta device (no memory, no time)."""
    import torch
    with torch.device("meta"):
        return dict(GPT(cfg).state_dict())


def start(folder, n_loop=None, dtype="float32", kv_memory=0.1, max_num_seqs=32, seed=0, kv_share=None, **engine_args):
    """vllm.LLM on the export, after check_export: float32 by default (the exactness claims are float32), eager;
    kv_memory: the share of memory vLLM reserves for its key/value pages (on the CPU, of host memory: its 0.92 default
    is refused on a shared 24 GiB machine). n_loop: another loop count, kv_share another sharing of keys and values
    across loops (hf_overrides, as from_pretrained's keys)."""
    missing = vllm_missing()
    if missing:
        raise ConfigError(missing)
    cfg, K = check_export(folder, n_loop, kv_share=kv_share)
    from vllm import LLM
    overrides = ({"n_loop": K} if n_loop is not None else {}) | ({"kv_share": kv_share} if kv_share is not None else {})
    engine_args.setdefault("enforce_eager", True)  # on a GPU, False captures CUDA graphs (.ci/gpu.sh times both)
    return LLM(model=folder, dtype=dtype, gpu_memory_utilization=kv_memory,
               max_model_len=cfg.block_size, max_num_seqs=max_num_seqs, seed=seed, hf_overrides=overrides,
               **engine_args)


def agreement(model, prompts, outputs, n_loop=None):
    """vLLM's greedy outputs (RequestOutput, asked with logprobs and prompt_logprobs of the whole vocabulary) against
    model.py on the same weights: {'identical': sequences whose new tokens equal GPT.generate's greedy ones (what
    sample.py --temperature=0 runs), 'ties': the others whose first difference is a tie in float32 (model.py's top two
    within 1e-5 there), 'max_dlogp': the largest |log p| difference over every prompt and generated position and
    token, 'tokens': new tokens compared}."""
    import torch
    out = {"identical": 0, "ties": 0, "max_dlogp": 0.0, "tokens": 0}
    for p, o in zip(prompts, outputs):
        new = list(o.outputs[0].token_ids)
        ref = model.generate(torch.tensor([p]), len(new), temperature=0, n_loop=n_loop)[0, len(p):].tolist()
        with torch.no_grad():  # model.py's log p at every position of the engine's sequence, as it decodes it: the
            cache = model.new_cache(n_loop)  # prompt in one call, then a token a call (kv_share='latest' reads so)
            steps = [torch.tensor([p])] + [torch.tensor([[t]]) for t in new[:-1]]
            lp = torch.log_softmax(torch.cat([model.head(model.hidden(x, n_loop, cache=cache))[0] for x in steps])
                                   .double(), -1)
        rows = list(o.prompt_logprobs[1:]) + list(o.outputs[0].logprobs)  # position t's: the token after t
        for t, d in enumerate(rows):
            for tok, l in d.items():
                out["max_dlogp"] = max(out["max_dlogp"], abs(l.logprob - lp[t, tok].item()))
        out["tokens"] += len(new)
        if ref == new:
            out["identical"] += 1
            continue
        j = next(i for i, (a, b) in enumerate(zip(ref, new)) if a != b)
        top2 = lp[len(p) - 1 + j].topk(2).values
        out["ties"] += bool(top2[0] - top2[1] < 1e-5)
    return out


def refuse_keys(keys):
    """One line for an exit rule or a speculative key given to the engine: it runs every loop of every token, and
    decodes with its own scheduler (model.py's adaptive depth and pipelined decoder are sample.py's and
    eval_harness.py's --backend=discoloop)."""
    for k, v in keys.items():
        default = {**EXIT_KEYS, **SPEC_KEYS}[k]
        if v not in (default, str(default)) and not (isinstance(default, (int, float)) and _num(v) == default):
            raise ConfigError(f"{k}={v!r} cannot run in vLLM (it runs every loop of every token with its own "
                              f"scheduler): allowed {default!r} with --backend=vllm; --backend=discoloop runs it")


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def stop(llm):
    """Shut an engine down and free its key/value pages now (a second engine in the same process is otherwise
    refused for memory the first still holds)."""
    import gc
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()
