"""
The export (export_hf.py's folder, config.json's DiscoLoopForCausalLM) in vLLM: paged key/value memory, continuous
batching, prefix caching, and on a GPU CUDA graphs, for every recurrence the export covers. It runs model.py's own
forward (GPT.hidden: embed, prelude, loop_step K times, coda; the head), never a restatement of it: the one thing it
brings is the key/value memory. Each (loop, layer) slot model.py's generation keeps (GPT.new_cache) is one vLLM
`Attention` here, and model.py's attention hands its queries, keys and values to that slot (`EngineSlot.attend`), as
it hands them to a KVCache; positions are each token's own, as vLLM flattens a batch into one row of tokens.

Registered by the `vllm.general_plugins` entry point (serve/pyproject.toml -> register()), so `vllm serve EXPORT_DIR` and
`LLM(model=EXPORT_DIR)` find it in every process vLLM starts; `pip install -r requirements-serve.txt` installs it.
`--hf-overrides '{"n_loop": 6}'` runs another loop count, as from_pretrained(DIR, n_loop=6) does. Imports vLLM:
nothing else in the repo imports this file.
"""
import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from model import GPT, GPTConfig, RECURRENCES

ARCH = "DiscoLoopForCausalLM"


class DiscoLoopConfig(PretrainedConfig):
    """config.json as vLLM reads it: every GPTConfig field as export_hf.py wrote it, plus the names vLLM asks a
    config for (hidden_size, heads, key/value heads, head size, layers). Registered for model_type 'discoloop', so the
    engine never runs the export folder's own code (no trust_remote_code)."""
    model_type = "discoloop"
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

    def __init__(self, **kwargs):
        for name, default in GPTConfig.defaults().items():
            setattr(self, name, kwargs.pop(name, default))
        self.trained_n_loop = kwargs.pop("trained_n_loop", self.n_loop)
        kwargs.setdefault("tie_word_embeddings", self.tie_embeddings)
        super().__init__(**kwargs)
        self.num_key_value_heads = self.n_kv_head or self.n_head
        self.head_dim = self.n_embd // self.n_head

    def gpt_config(self):
        """The GPTConfig that builds the model (the trained K; n_loop is the count it runs)."""
        return GPTConfig.from_dict({**{k: getattr(self, k) for k in GPTConfig.defaults()},
                                    "n_loop": self.trained_n_loop})


def slots(cfg, n_loop):
    """The (loop, layer) pairs that keep keys and values, as model.py's forward uses them: loop 1 holds the prelude's
    and the coda's layers and its own; loops 2..n_loop only the looped layers (recurrence='none': every layer of each
    copy). Their count is the key/value memory per token in units of one layer's 2 x kv heads x head size."""
    looped = range(cfg.n_prelude, cfg.n_layer - cfg.n_coda)
    if cfg.kv_share:  # one slot per layer, seen by every loop (model.py's SharedSlot)
        return [(0, i) for i in range(cfg.n_layer)]
    return [(k, i) for k in range(n_loop) for i in range(cfg.n_layer) if k == 0 or i in looped]


class EngineSlot:
    """One (loop, layer) of vLLM's paged key/value memory, answering what model.py's attention asks of a cache:
    start() = every token's own position (1, N), attend(q, k, v) = vLLM's attention over (1, heads, N, head size)
    rows, (1, N, heads x head size) out. vLLM's forward context says which tokens are whose and where each is cached."""

    def __init__(self, attn, where, first=None):
        self.attn, self.where, self.first = attn, where, first

    def start(self):
        return self.where["positions"]

    def attend(self, q, k, v):
        flat = lambda t: t[0].transpose(0, 1).reshape(t.size(2), -1)  # (N, heads x head size), as vLLM takes them
        q, k, v = flat(q), flat(k), flat(v)
        if self.first is not None:  # kv_share='first': loop 1 keeps its rows, the later loops write those again
            if self.first.get("loop1") is self:
                self.first["kv"] = (k, v)
            k, v = self.first["kv"]
        return self.attn(q, k, v)[None]


class DiscoLoopForCausalLM(nn.Module):
    """vLLM's model class for the export: model.py's GPT, and one vLLM Attention per (loop, layer) slot."""

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        from vllm.model_executor.layers.attention import Attention
        hf = vllm_config.model_config.hf_config
        self.config = hf
        self.gpt = GPT(hf.gpt_config())
        cfg, K = self.gpt.config, hf.n_loop
        if RECURRENCES[cfg.recurrence].copies and K > cfg.n_loop:
            raise ValueError(f"n_loop={K} is invalid: allowed 1..{cfg.n_loop} for recurrence='none'")
        hs = cfg.n_embd // cfg.n_head
        self.where = {"positions": None}
        self.attn = nn.ModuleList()  # vLLM finds and sizes each by its prefix: one integer, loop x n_layer + layer
        self.slots = [[None] * cfg.n_layer for _ in range(K)]
        for k, i in slots(cfg, K):
            a = Attention(cfg.n_head, hs, hs ** -0.5, num_kv_heads=cfg.n_kv_head or cfg.n_head,
                          cache_config=vllm_config.cache_config, prefix=f"{prefix}.slots.{k * cfg.n_layer + i}.attn")
            self.attn.append(a)
            if not cfg.kv_share:
                self.slots[k][i] = EngineSlot(a, self.where)
                continue
            first = {} if cfg.kv_share == "first" else None  # kv_share: every loop's view of layer i's one slot
            for loop in range(K):
                self.slots[loop][i] = EngineSlot(a, self.where, first)
            if first is not None:
                first["loop1"] = self.slots[0][i]
        self.n_loop = K

    def embed_input_ids(self, input_ids):
        return self.gpt.transformer.wte(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        """(N, d): the state the head reads, after n_loop loops, of the N tokens vLLM runs in this step."""
        if inputs_embeds is not None:
            raise ValueError("DiscoLoop in vLLM takes token ids, not inputs_embeds")
        self.where["positions"] = positions[None]
        try:
            return self.gpt.hidden(input_ids[None], n_loop=self.n_loop, cache=self.slots)[0]
        finally:
            self.where["positions"] = None

    def compute_logits(self, hidden_states):
        return self.gpt.head(hidden_states)

    def load_weights(self, weights):
        """export_hf.py's model.safetensors ('gpt.' + model.py's names; a tied head stored once)."""
        params = dict(self.gpt.named_parameters())
        loaded = set()
        for name, w in weights:
            key = name.removeprefix("gpt.")
            if key not in params:
                raise ValueError(f"the export's weight {name!r} is not one of model.py's for this config")
            params[key].data.copy_(w.to(params[key].dtype))
            loaded.add(f"gpt.{key}")
        if self.gpt.config.tie_embeddings:
            loaded.add("gpt.lm_head.weight")
        missing = sorted({f"gpt.{n}" for n in params} - loaded)
        if missing:
            raise ValueError(f"the export lacks {missing[:3]}: export it again with export_hf.py")
        return loaded


def register():
    """The vllm.general_plugins entry point: the config class for model_type 'discoloop' and the model class."""
    from vllm import ModelRegistry
    try:
        AutoConfig.register("discoloop", DiscoLoopConfig)
    except ValueError:  # registered already in this process
        pass
    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "discoloop.vllm_model:DiscoLoopForCausalLM")
