"""The lab for torch.compile's regions: seconds to the first step and the later step, eager against each Block
compiled on its own (train.py's compile=True, promoted) and against the whole unrolled model (rejected: 181 s to the
first step at 24 x 4 on a CPU, RESULTS.md).

    python lab/compile.py config/pretrain.py --threads=1
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import torch  # noqa: E402

from bench import timed, training_config  # noqa: E402
from discoloop.common import ConfigError, die, setup, table  # noqa: E402
from configurator import INT_GE1  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


# the toy width (a comment on the line itself would be --help's meaning of these keys)
TOY = dict(n_embd=64, n_head=4, block_size=64, vocab_size=2048, batch_size=2)


def main(argv):
    """python lab/compile.py CONFIG [--modes=eager,blocks,whole] [--steps=3]: seconds to the first training step (compile
    included, Inductor's caches off) and the later step time, eager against each Block compiled on its own (train.py's
    compile=True) and against the whole unrolled model, at the config's depth, K and options and a toy width (TOY, but
    for the keys the command line gives), in one process; unique compiled graphs show whether anything recompiles across layers or loops."""
    from torch import _dynamo
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    extra = {"modes": "eager,blocks,whole",  # comma list of eager | blocks (per block) | whole (torch.compile(model))
             "steps": 3}                     # later steps timed (median), after the first
    c = training_config(argv, "lab/compile.py", main.__doc__, extra, {"steps": INT_GE1}, need_vocab=False,
                        files=[__file__])
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}  # the command line's keys beat the toy width
    c.update({k: v for k, v in TOY.items() if k not in given})
    modes = c["modes"].split(",")
    try:
        if not set(modes) <= {"eager", "blocks", "whole"} or len(set(modes)) < len(modes):
            raise ConfigError(f"modes={c['modes']!r} is invalid: a comma list of eager, blocks, whole, each once "
                              "(the first is the reference)")
        cfg = GPTConfig.from_dict(c)
        device = setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)
    inductor_config.force_disable_caches = True  # seconds to the first step as a new machine sees them
    x = torch.randint(0, cfg.vocab_size, (c["batch_size"], c["block_size"]), device=device)
    rows = []
    for mode in modes:
        _dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = GPT(cfg).to(device)
        m = model.compile_blocks() if mode == "blocks" else torch.compile(model) if mode == "whole" else model

        def step():
            m(x, x)[1].backward()

        first = timed(step, 1, device)
        later = timed(step, c["steps"], device)
        rows.append([mode, round(first, 1), round(later * 1000, 1), counters["stats"]["unique_graphs"]])
    ref = rows[0][2]
    print(f"{cfg.recurrence} n_layer={cfg.n_layer} K={cfg.n_loop} activation_checkpointing={cfg.activation_checkpointing!r}, "
          f"d={cfg.n_embd} T={cfg.block_size} V={cfg.vocab_size} B={c['batch_size']}, device {device}, torch {torch.__version__}")
    print(table(["mode", "first step s", "later step ms", "compiled graphs", f"step vs {rows[0][0]}"],
                [row + [f"{row[2] / ref:.3f}x"] for row in rows]))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
