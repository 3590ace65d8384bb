"""compile=True compiles each Block on its own (GPT.compile_blocks), never the unrolled model: the same logits and
gradients as eager for every recurrence and option, ONE compiled graph for every layer and loop (a recompile is an
error), block checkpointing kept (what autograd saves stays eager's), and generation, hooks and train.py's resume
still work. The recurrence sweep compiles with backend 'aot_eager' (Dynamo's capture and AOTAutograd's
partitioning, which is where a per-block compile can go wrong, without Inductor's code generation, which costs
seconds a config); one test runs the default Inductor backend end to end."""
import json
import os

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from conftest import run
from model import GPT, GPTConfig

OPTIONS = [  # every recurrence, and the options that change what runs between or around the blocks
    dict(recurrence="disco", n_loop=3, phi_topk=8, activation_checkpointing="block", sandwich_norm=True),
    dict(recurrence="disco", n_loop=2, disco_gate="learned", per_loop_norm=True, pos_emb="learned", mlp="gelu",
         norm="layernorm", bias=True),
    dict(recurrence="loop", n_loop=3, n_layer=4, n_prelude=1, n_coda=1, activation_checkpointing="block"),
    dict(recurrence="none", n_loop=2),
    dict(recurrence="ponder", n_loop=3, ponder_scale_embeds=True, pos_emb="learned"),
]


def make(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=16, vocab_size=61, n_layer=3, n_head=2, n_embd=16) | kw
    return GPT(GPTConfig(**cfg))


def step(model, x, hook=None):
    """Logits (with a hook on every loop), then the loss's gradients: (logits, {name: grad})."""
    model.zero_grad(set_to_none=True)
    logits, _ = model(x, hook=hook)
    _, loss = model(x, x)
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def fresh():
    torch._dynamo.reset()
    counters.clear()


@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: kw["recurrence"] + "-" + "-".join(map(str, kw.values()))[:40])
def test_per_block_compile_equals_eager_with_one_graph(kw):
    x = torch.randint(0, 61, (2, 12))
    seen = []

    def hook(k, h, h_next):  # the probes' hook: reads every loop and replaces what feeds the next one
        seen.append(k)
        return h_next * 1.5

    eager = step(make(**kw), x, hook)
    fresh()
    compiled = make(**kw).compile_blocks(backend="aot_eager")
    got = step(compiled, x, hook)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # one graph: every layer and loop
    torch.testing.assert_close(got[0], eager[0], rtol=1e-5, atol=1e-6)
    assert got[1].keys() == eager[1].keys()
    for name in eager[1]:
        torch.testing.assert_close(got[1][name], eager[1][name], rtol=1e-4, atol=1e-6, msg=name)
    with torch._dynamo.config.patch(error_on_recompile=True):  # the same shapes again: nothing recompiles
        step(compiled, x, hook)
    assert seen and set(seen) == set(range(1, kw["n_loop"] + 1))


def saved_bytes(model, x):
    """Bytes autograd keeps for backward in one training step (parameters excluded), as bench.saved_bytes counts."""
    total, params = [0], {p.data_ptr() for p in model.parameters()}

    def pack(t):
        total[0] += 0 if t.data_ptr() in params else t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(x, x)
    loss.backward()
    return total[0]


def test_inductor_per_block_compile_matches_and_keeps_block_checkpointing():
    """Inductor end to end: same loss and gradients, and checkpoint(block) compiled whole keeps what eager block
    checkpointing keeps (the negative control: the compiled model without checkpointing keeps a block's
    activations, so the test can fail)."""
    kw = dict(n_layer=4, n_embd=32, n_head=2, recurrence="disco", n_loop=3, phi_topk=8, sandwich_norm=True)
    x = torch.randint(0, 61, (2, 16))
    saved = {}
    for ck in ("block", "none"):
        eager = make(**kw, activation_checkpointing=ck)
        ref = step(eager, x)
        saved[ck, "eager"] = saved_bytes(eager, x)
        fresh()
        compiled = make(**kw, activation_checkpointing=ck).compile_blocks()
        got = step(compiled, x)
        for name in ref[1]:
            torch.testing.assert_close(got[1][name], ref[1][name], rtol=1e-4, atol=1e-5, msg=name)
        saved[ck, "compiled"] = saved_bytes(compiled, x)
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    # eager checkpoint keeps each block's input (and the RNG state, rope tables) by reference, out of the hooks'
    # sight; the compiled checkpoint saves the same through them: at most a few inputs' worth a block call
    calls, one_input = 4 * 3, x.numel() * 32 * 4
    extra = {ck: (saved[ck, "compiled"] - saved["block", "eager"]) / calls for ck in ("block", "none")}
    assert extra["block"] <= 3 * one_input, (extra, one_input)
    assert extra["none"] > 10 * one_input, (extra, one_input)  # without checkpointing: a block's activations


def test_generate_and_undo_with_compiled_blocks():
    """Generation runs the blocks eager (a compiled block would recompile for every cache length): the same tokens;
    compile_blocks(enable=False) restores the eager modules."""
    x = torch.randint(0, 61, (1, 4))
    eager = make(recurrence="disco", n_loop=2).eval()
    want = eager.generate(x, 6, temperature=0)
    fresh()
    model = make(recurrence="disco", n_loop=2).eval().compile_blocks(backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(model.generate(x, 6, temperature=0), want)
    assert counters["stats"]["unique_graphs"] == 0  # the cache path never entered a compiled block
    model.compile_blocks(enable=False)
    assert not any("forward" in vars(b) for b in model.transformer.h)


def test_train_compiled_resumes(tiny_data, tmp_path):
    """train.py --compile=True trains, saves names without a compile prefix, and resumes compiled."""
    from conftest import tiny_train_args
    out = str(tmp_path / "run")
    # a new interpreter: Inductor's compile workers do not start in a child forked from the tests' zygote
    r = run(tiny_train_args(tiny_data, out, "--compile=True", "--max_iters=2", "--eval_interval=2"), fresh=True)
    assert r.returncode == 0 and "per block" in r.stdout and "torch.compile failed" not in r.stderr, r.stderr[-2000:]
    r = run(tiny_train_args(tiny_data, out, "--compile=True", "--max_iters=4", "--eval_interval=2",
                            "--init_from=resume", "--compile_mode=reduce-overhead"), fresh=True)  # CUDA graphs: a GPU's
    assert r.returncode == 0 and "torch.compile failed" not in r.stderr, r.stderr[-2000:]
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [row["iter"] for row in rows] == [0, 2, 4]
    keys = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["model"].keys()
    assert not any("_orig_mod" in k for k in keys)
