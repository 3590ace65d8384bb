"""
The Hugging Face face of model.py: export_hf.py writes this file into an export folder next to copies of
model.py, kernels.py and muon.py, so that

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)            # the trained K loops
    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, n_loop=6)  # more loops (as Ouro's total_ut_steps)

runs exactly model.py's forward, and transformers' generate() runs model.py's key/value cache per (loop, layer)
(GPT.new_cache), refusing, as GPT.generate does, to run past block_size. The repo itself never imports it (its
imports are relative to the folder).
"""
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .model import GPT, RECURRENCES, GPTConfig, rope_cache


class DiscoLoopConfig(PretrainedConfig):
    """Every GPTConfig field at the top level of config.json (model.py's default where absent). `n_loop` is the
    loop count the model runs; `trained_n_loop` the K it was trained with, which builds the model (PonderLM's
    input multiplier and the untied copies of recurrence='none' depend on it), as model.py's n_loop argument."""
    model_type = "discoloop"

    def __init__(self, **kwargs):
        for name, default in GPTConfig.defaults().items():
            setattr(self, name, kwargs.pop(name, default))
        self.trained_n_loop = kwargs.pop("trained_n_loop", self.n_loop)
        kwargs.setdefault("tie_word_embeddings", self.tie_embeddings)  # transformers ties the head when this says so
        kwargs.pop("max_position_embeddings", None)  # always block_size: the model has no longer window
        super().__init__(**kwargs)
        self.max_position_embeddings = self.block_size
        self.gpt_config()  # a bad value is an error here, not at the first forward

    def gpt_config(self):
        """The GPTConfig that builds the model (n_loop = the trained K), after model.py's one validator has checked
        every field with the loop count the model runs: n_loop >= 1 (>= 2 where Phi is decoded between loops), and
        no more than the trained K for the untied copies of recurrence='none'. A ValueError names the bad value.
        Called again when the model is built: from_pretrained(DIR, n_loop=...) sets n_loop after __init__."""
        fields = {name: getattr(self, name) for name in GPTConfig.defaults()}
        GPTConfig.from_dict(fields)
        trained = GPTConfig.from_dict({**fields, "n_loop": self.trained_n_loop})
        if RECURRENCES[self.recurrence].copies and self.n_loop > self.trained_n_loop:
            raise ValueError(f"n_loop={self.n_loop} is invalid: allowed 1..{self.trained_n_loop} for "
                             "recurrence='none' (its copies of f are untied: no loops past the trained K)")
        tied = getattr(self, "tie_word_embeddings", self.tie_embeddings)
        if bool(tied) != bool(self.tie_embeddings):
            head = "tied to the embedding" if self.tie_embeddings else "its own weight"
            raise ValueError(f"tie_word_embeddings={tied} contradicts tie_embeddings={self.tie_embeddings}: the "
                             f"exported head is {head}")
        return trained


class DiscoLoopCache:
    """model.py's key/value cache for transformers' generate(): one KVCache per (loop, layer) (GPT.new_cache), for
    the loop count it was made with, plus what generate() asks of a cache (its length; beams reorder it, assisted
    decoding crops it). Made by the first forward with use_cache=True, returned as past_key_values."""
    is_compileable = False
    is_croppable = True

    def __init__(self, gpt, n_loop):
        self.n_loop = n_loop
        self.layers = gpt.new_cache(n_loop)

    def get_seq_length(self, layer_idx=0):
        return len(self.layers[0][0])

    def _each(self, fn):
        for c in {id(s): s for s in (getattr(c, "slot", c) for loop in self.layers for c in loop)}.values():
            if c.k is not None:  # kv_share: every loop's view of one slot per layer, each slot once
                c.k, c.v = fn(c.k), fn(c.v)
                if hasattr(c, "base"):
                    c.base = min(c.base, c.k.size(2))

    def reorder_cache(self, beam_idx):
        self._each(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def crop(self, max_length):
        keep = max_length if max_length >= 0 else self.get_seq_length() + max_length  # negative: drop that many
        self._each(lambda t: t[:, :, :keep])


class DiscoLoopForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = DiscoLoopConfig
    base_model_prefix = "gpt"
    _tied_weights_keys = {"gpt.lm_head.weight": "gpt.transformer.wte.weight"}  # W is embedding and head (when tied)

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config())
        self.post_init()

    def _init_weights(self, module):
        # every weight comes from model.safetensors; the RoPE tables are not weights, so they are rebuilt here
        # (loading may construct the model on the meta device, where __init__'s tables hold no values)
        if module is self.gpt and hasattr(module, "rope_cos"):
            cfg = self.gpt.config
            cos, sin = rope_cache(cfg.n_embd // cfg.n_head, cfg.block_size, cfg.rope_theta)
            module.rope_cos, module.rope_sin = cos.to(module.rope_cos.device), sin.to(module.rope_sin.device)

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, n_loop=None, past_key_values=None, use_cache=None,
                **kwargs):
        """Logits of every position (B, T, V) after n_loop loops (default: config.n_loop, the trained K unless
        overridden at load); labels: the mean next-token loss as transformers computes it (labels shifted inside,
        -100 ignored). use_cache=True (generate) returns past_key_values, a DiscoLoopCache; given back, input_ids
        are the positions after the cached ones."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attention_mask with zeros: padding inside a batch is not supported; pad on the "
                             "right (causal attention never sees it) and pass no mask")
        K = n_loop or self.config.n_loop
        cache = past_key_values
        if cache is None and use_cache and labels is None:
            cache = DiscoLoopCache(self.gpt, K)
        if cache is not None and not (isinstance(cache, DiscoLoopCache) and cache.n_loop == K):
            got = f"n_loop={cache.n_loop}" if isinstance(cache, DiscoLoopCache) else type(cache).__name__
            raise ValueError(f"past_key_values must be the DiscoLoopCache of an earlier call with n_loop={K}, "
                             f"not {got}")
        logits = self.gpt.head(self.gpt.hidden(input_ids, n_loop=K, cache=cache.layers if cache is not None else None))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # transformers' per-layer caches do not fit K loops over shared layers: forward makes its own

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=None,
                                      n_loop=None, **kwargs):
        # with the cache, only the positions it has not seen; the mask goes on, so that padding is refused, not ignored
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        return {"input_ids": input_ids[:, seen:], "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": use_cache, "n_loop": n_loop}

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' generate(), refused before any work when the prompt plus the new tokens would run past
        block_size (as GPT.generate and sample.py refuse): sliding the window would move every position."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if ids is not None:
            gc = generation_config or self.generation_config
            new = kwargs["max_new_tokens"] if kwargs.get("max_new_tokens") is not None else gc.max_new_tokens
            total = ids.shape[-1] + new if new is not None else kwargs.get("max_length") or gc.max_length
            if total > self.config.block_size:
                asked = f"+ max_new_tokens={new}" if new is not None else f"with max_length={total}"
                room = max(0, self.config.block_size - ids.shape[-1])
                raise ValueError(f"prompt ({ids.shape[-1]} tokens) {asked} exceeds block_size="
                                 f"{self.config.block_size}: shorten the prompt or ask for fewer tokens "
                                 f"(max_new_tokens <= {room})")
        return super().generate(inputs, generation_config, **kwargs)
