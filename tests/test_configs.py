"""Every shipped config file is valid against train.py's defaults and builds a valid model."""
import glob
import os

import pytest
import torch

from conftest import REPO
from configurator import configure
from model import GPT, GPTConfig


from train_config import CHECKS, defaults as train_defaults  # noqa: E402  (GPTConfig's model keys, then the training keys)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "config", "*.py"))))
def test_config_valid(path):
    c = configure(train_defaults(), [path], checks=CHECKS)
    assert "exec(" not in open(path).read()  # every config reads alone
    c["vocab_size"] = c["vocab_size"] or 1000
    with torch.device("meta"):  # no memory for the 440M configs
        model = GPT(GPTConfig.from_dict(c))
    if os.path.basename(path) in ("pretrain.py", "pretrain_ponder.py"):
        # Appendix B: 440M parameters, 128 x 8192 tokens per step, 19,074 steps
        assert abs(model.get_num_params() / 440e6 - 1) < 0.02
        assert c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"] == 1_048_576
        assert c["max_iters"] == 19074 and c["n_loop"] == 4
