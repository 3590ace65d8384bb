"""The lab for torch.compile: graph breaks of one Block, the region train.py compiles.

    python lab/breaks.py config/pretrain.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


from bench import training_config  # noqa: E402
from discoloop.common import die  # noqa: E402
from configurator import INT_GE1  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def main(argv):
    """python lab/breaks.py CONFIG [--key=value ...]: torch.compile graph breaks of one Block's training forward, the
    region train.py compiles (torch._dynamo.explain runs on CPU; the count does not depend on T, so T is small)."""
    import torch._dynamo
    c = training_config(argv, "lab/breaks.py", main.__doc__, {"T": 64},  # sequence length traced (breaks do not depend on it)
                        {"T": INT_GE1}, need_file=False, need_vocab=False,
                        files=[__file__])
    try:
        cfg = GPTConfig.from_dict({**c, "block_size": c["T"]})
    except ValueError as e:
        die(e)
    model = GPT(cfg)
    x = torch.randn(1, c["T"], cfg.n_embd, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if cfg.pos_emb == "rope" else None
    ex = torch._dynamo.explain(model.transformer.h[0])(x, rope)
    print(f"{cfg.recurrence} top-k={cfg.phi_topk} activation_checkpointing={cfg.activation_checkpointing!r}: "
          f"{ex.graph_count} graph(s), {ex.graph_break_count} break(s)")
    for b in ex.break_reasons:
        where = b.user_stack[-1] if b.user_stack else None
        print(f"  break: {b.reason.splitlines()[0][:200]}" + (f" ({where.filename}:{where.lineno})" if where else ""))
    return ex.graph_break_count


if __name__ == "__main__":
    main(sys.argv[1:])
