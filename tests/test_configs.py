"""Every shipped config file is valid against train.py's defaults and builds a valid model; a config that derives from
another (its first statement: exec(open(sibling("parent.py")).read())) is its parent plus exactly the keys it lists."""
import ast
import glob
import os
import re

import pytest
import torch

from conftest import REPO
from configurator import configure, merge
from model import GPT, GPTConfig
from discoloop.train_config import CHECKS, defaults as train_defaults  # GPTConfig's model keys, then the training keys

CONFIGS = sorted(glob.glob(os.path.join(REPO, "config", "*.py")))
DERIVE = re.compile(r"exec\(open\(sibling\('([\w.-]+)'\)\)\.read\(\)\)")  # the derive line, as ast.unparse writes it


def effective(path):
    return configure(train_defaults(), [path], checks=CHECKS)


@pytest.mark.parametrize("path", CONFIGS)
def test_config_valid(path):
    c = effective(path)
    c["vocab_size"] = c["vocab_size"] or 1000
    with torch.device("meta"):  # no memory for the 440M configs
        model = GPT(GPTConfig.from_dict(c))
    if os.path.basename(path) in ("pretrain.py", "pretrain_ponder.py"):
        # Appendix B: 440M parameters, 128 x 8192 tokens per step, 19,074 steps
        assert abs(model.get_num_params() / 440e6 - 1) < 0.02
        assert c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"] == 1_048_576
        assert c["max_iters"] == 19074 and c["n_loop"] == 4


def parse(path):
    """(the parent's file name or None, {key: value} the file itself assigns); a problem raises AssertionError."""
    body = ast.parse(open(path).read()).body
    parent = DERIVE.fullmatch(ast.unparse(body[0])) if body else None
    own = {}
    for node in body[1:] if parent else body:
        line = f"{os.path.basename(path)}:{node.lineno}"
        assert isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name), \
            f"{line}: a config is `key = value` lines after its one derive line, got: {ast.unparse(node)}"
        key = node.targets[0].id
        assert key not in own, f"{line}: {key} assigned twice"
        own[key] = ast.literal_eval(node.value)  # a plain value, not one computed from the parent's
    return (parent and parent.group(1)), own


def derivation_problems(path):
    """What makes a derived config differ from its parent's effective config plus its own keys; [] if nothing."""
    parent, own = parse(path)
    if parent is None:
        return []
    base = effective(os.path.join(os.path.dirname(path), parent))
    problems = [f"{k} = {v!r} is already the parent's value" for k, v in merge(base, own, path).items()
                if k in own and v == base[k]]
    if effective(path) != merge(base, own, path, CHECKS):
        problems.append(f"differs from {parent} plus its own keys {sorted(own)}")
    return problems


@pytest.mark.parametrize("path", CONFIGS)
def test_config_states_only_what_it_changes(path):
    assert derivation_problems(path) == []


def test_derived_check_can_fail(tmp_path):
    (tmp_path / "parent.py").write_text('out_dir = "out/a"\nn_loop = 3\n')
    child = tmp_path / "child.py"
    child.write_text('exec(open(sibling("parent.py")).read())\nn_loop = 3\nn_layer = 2\n')  # n_loop: a pasted copy
    assert derivation_problems(str(child)) == ["n_loop = 3 is already the parent's value"]
    child.write_text('exec(open(sibling("parent.py")).read())\nn_layer = 2\nn_layer = 3\n')
    with pytest.raises(AssertionError, match="n_layer assigned twice"):
        parse(str(child))
    child.write_text('exec(open(sibling("parent.py")).read())\nn_layer = 2\nexec(open(sibling("parent.py")).read())\n')
    with pytest.raises(AssertionError, match="child.py:3: a config is `key = value` lines"):
        parse(str(child))


def test_derived_config_from_any_directory(monkeypatch):
    """sibling() finds the parent beside the config file, whatever the working directory (a chain of two here)."""
    path = os.path.join(REPO, "config", "symbolic_paper_hold.py")
    want = effective(path)
    assert want["init_from"] == "out/paper_loop/ckpt_39000.pt" and want["recurrence"] == "loop"  # both parents ran
    assert want["n_embd"] == 192
    monkeypatch.chdir(os.path.join(REPO, "config"))
    assert effective("symbolic_paper_hold.py") == want
    monkeypatch.chdir("/")
    assert effective(path) == want
