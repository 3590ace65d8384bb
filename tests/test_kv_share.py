"""kv_share (issue 74): what each loop's attention reads for earlier positions. 'first': loop 1's keys and values,
written once, so training's parallel forward is exactly what cached decoding computes, with one slot per layer;
'latest' (inference): the last loop each earlier position wrote (Huginn's), which exists only in decoding. The
pipelined decoder follows 'first' with greedy output equal to plain decoding; what cannot follow is one line."""
import pytest
import torch

from conftest import one_line, run, tiny_train_args

from discoloop import speculative
from discoloop.common import ConfigError
from model import GPT, GPTConfig, SharedSlot

ARCHS = [dict(recurrence="disco"), dict(recurrence="loop", n_prelude=1, n_coda=1),
         dict(recurrence="disco", pos_emb="learned", pos_every_loop=True, disco_gate="learned")]


def model(share, **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=64, n_layer=3, n_head=2, n_embd=32, n_loop=3, kv_share=share, **kw))
    with torch.no_grad():
        m.transformer.wte.weight.mul_(10)  # greedy choices away from ties
    return m.eval()


def decoded(m, x, first=5):
    """Logits of x as generation computes them: the first `first` positions in one call, then one a call."""
    cache = m.new_cache()
    with torch.no_grad():
        parts = [m.head(m.hidden(x[:, :first], cache=cache))]
        parts += [m.head(m.hidden(x[:, t:t + 1], cache=cache)) for t in range(first, x.size(1))]
    return torch.cat(parts, 1), cache


@pytest.mark.parametrize("kw", ARCHS)
def test_first_trains_what_decoding_computes_with_one_slot_per_layer(kw):
    m = model("first", **kw)
    x = torch.randint(0, 50, (2, 14))
    with torch.no_grad():
        full = m(x)[0]
    inc, cache = decoded(m, x)
    assert (full - inc).abs().max() < 1e-5
    slots = {id(v.slot) for loop in cache for v in loop}
    assert len(slots) == m.config.n_layer  # K x fewer than one per (loop, layer)
    assert all(isinstance(v.slot, SharedSlot) and v.slot.k.size(2) == 14 for v in cache[0])
    per_loop = model("", **kw)
    per_loop.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert (per_loop(x)[0] - full).abs().max() > 1e-4  # loops 2..K read other keys: a different model


@pytest.mark.parametrize("kw", ARCHS[:2])
def test_latest_is_decodings_and_reads_the_last_loop_of_earlier_positions(kw):
    m = model("latest", **kw)
    x = torch.randint(0, 50, (2, 12))
    inc, cache = decoded(m, x)
    with torch.no_grad():
        assert (m(x)[0][:, :5] - inc[:, :5]).abs().max() < 1e-5  # a prompt in one call: each loop its own
        assert (m(x)[0][:, 5:] - inc[:, 5:]).abs().max() > 1e-4  # one a call: loop k reads loop K's of the past
        assert (m.head(m.hidden_stepwise(x)) - decoded(m, x, first=1)[0]).abs().max() < 1e-5
        y = m.generate(x[:1, :5], 10, temperature=0)
        step = x[:1, :5]
        for _ in range(10):
            step = torch.cat([step, m.head(m.hidden_stepwise(step))[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(y, step)


@pytest.mark.parametrize("kw", ARCHS)
def test_the_pipelined_decoder_follows_first(kw):
    m = model("first", **kw)
    x = torch.randint(0, 50, (1, 6))
    ref = m.generate(x, 24, temperature=0)
    for propose, recheck in ((1, 0), (1, 2), (2, 0)):
        spec = speculative.spec_option(0, 4, m, propose=propose, recheck=recheck)
        assert torch.equal(speculative.generate(m, x, 24, spec, temperature=0), ref), (propose, recheck)


def test_what_cannot_share_is_one_line(tiny_data, tmp_path):
    for rec in ("none", "ponder"):
        with pytest.raises(ValueError, match="kv_share"):
            GPTConfig(vocab_size=50, n_layer=1, n_head=2, n_embd=32, recurrence=rec, kv_share="first")
    with pytest.raises(ValueError, match="activation_checkpointing"):
        GPTConfig(vocab_size=50, n_layer=1, n_head=2, n_embd=32, kv_share="first", activation_checkpointing="block")
    with pytest.raises(ConfigError, match="speculative_propose"):
        speculative.spec_option(1, 3, model("first"))
    with pytest.raises(ConfigError, match="kv_share='latest'"):
        speculative.spec_option(0, 4, model("latest"), propose=1)
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--max_iters=1", "--kv_share=latest")),
             "kv_share='latest' is an inference key")
    r = run(tiny_train_args(tiny_data, str(tmp_path / "f"), "--max_iters=4", "--eval_interval=2", "--kv_share=first",
                            "--recurrence=loop"))
    assert r.returncode == 0, r.stderr[-2000:]
    one_line(run(["sample.py", f"--ckpt={tmp_path / 'f'}", "--kv_share=latest", "--use_cache=False"]),
             "kv_share='latest' reads what the cache kept")
