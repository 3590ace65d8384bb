"""
The Hugging Face face of model.py: export_hf.py writes this file into an export folder next to copies of
model.py and kernels.py, so that

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)            # the trained K loops
    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, n_loop=6)  # more loops (as Ouro's total_ut_steps)

runs exactly model.py's forward. The repo itself never imports it (its imports are relative to the folder).
"""
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .model import GPT, GPTConfig, rope_cache


class DiscoLoopConfig(PretrainedConfig):
    """Every GPTConfig field at the top level of config.json (model.py's default where absent). `n_loop` is the
    loop count the model runs; `trained_n_loop` the K it was trained with, which builds the model (PonderLM's
    input multiplier and the untied copies of recurrence='none' depend on it), as model.py's n_loop argument."""
    model_type = "discoloop"

    def __init__(self, **kwargs):
        for name, default in GPTConfig.defaults().items():
            setattr(self, name, kwargs.pop(name, default))
        self.trained_n_loop = kwargs.pop("trained_n_loop", self.n_loop)
        kwargs.setdefault("tie_word_embeddings", True)
        kwargs.pop("max_position_embeddings", None)  # always block_size: the model has no longer window
        super().__init__(**kwargs)
        self.max_position_embeddings = self.block_size

    def gpt_config(self):
        return GPTConfig.from_dict({**{name: getattr(self, name) for name in GPTConfig.defaults()},
                                    "n_loop": self.trained_n_loop})


class DiscoLoopForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = DiscoLoopConfig
    base_model_prefix = "gpt"
    _tied_weights_keys = {"gpt.lm_head.weight": "gpt.transformer.wte.weight"}  # W is embedding and head

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

    def forward(self, input_ids, attention_mask=None, labels=None, n_loop=None, **kwargs):
        """Logits of every position (B, T, V) after n_loop loops (default: config.n_loop, the trained K unless
        overridden at load); labels: the mean
        next-token loss as transformers computes it (labels shifted inside, -100 ignored)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attention_mask with zeros: padding inside a batch is not supported; pad on the "
                             "right (causal attention never sees it) and pass no mask")
        logits = self.gpt.head(self.gpt.hidden(input_ids, n_loop=n_loop or self.config.n_loop))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # transformers' per-layer caches do not fit K loops over shared layers

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        # no key/value cache through transformers (model.py has its own, GPT.generate): the whole prefix each step
        return {"input_ids": input_ids[:, -self.config.block_size:]}
