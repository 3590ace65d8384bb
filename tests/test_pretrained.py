"""GPT.from_pretrained: tiny random GPT-2, Llama (grouped-query, tied and untied) and Qwen2 (q, k, v biases) models
built locally with transformers (no download), saved with save_pretrained, load with logits equal to transformers'
own: float32 to 1e-4, float64 to 1e-12. Plus looping a pretrained stack, cached generation with GQA, and the
one-line errors."""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import GPT  # noqa: E402

V, T = 61, 12


def gpt2(tmp):
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def llama(tmp, tie=False):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, rope_theta=5000.0, tie_word_embeddings=tie,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return transformers.LlamaForCausalLM(cfg)


def qwen2(tmp):
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                                   rope_theta=1e6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    return transformers.Qwen2ForCausalLM(cfg)


MAKERS = {"gpt2": gpt2, "llama": llama, "llama_tied": lambda tmp: llama(tmp, tie=True), "qwen2": qwen2}


def saved(name, tmp_path, **save):
    """A random transformers model with non-trivial norms and biases, saved to tmp_path; (hf model, folder)."""
    torch.manual_seed(0)
    hf = MAKERS[name](tmp_path).eval()
    with torch.no_grad():  # the default init leaves norms at 1 and biases at 0: make every term matter
        for n, p in hf.named_parameters():
            if "norm" in n or "ln" in n or n.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    folder = str(tmp_path / name)
    hf.save_pretrained(folder, **save)
    return hf, folder


def hf_logits(hf, idx):
    with torch.no_grad():
        return hf(input_ids=idx).logits


@pytest.fixture(scope="module", params=list(MAKERS))
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    return (request.param,) + saved(request.param, tmp_path_factory.mktemp("hf"))


def float64_rmsnorm(self, x):
    """transformers' Llama/Qwen2 RMSNorm without its cast to float32 (which caps a float64 comparison at ~1e-8)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_logits_equal_transformers_float32_and_float64(pair, monkeypatch):
    name, hf, folder = pair
    model = GPT.from_pretrained(folder)
    assert model.config.recurrence == "loop" and model.config.n_loop == 1 and not model.training
    assert model.config.tie_embeddings == (name in ("gpt2", "llama_tied"))
    if name != "gpt2":
        assert model.config.n_kv_head == hf.config.num_key_value_heads < model.config.n_head
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        ours = model(idx)[0]
    torch.testing.assert_close(ours, hf_logits(hf, idx), rtol=0, atol=1e-4)
    with torch.no_grad():
        ours64 = model.double()(idx)[0]
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    for norm in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(norm, "forward", float64_rmsnorm)
    torch.testing.assert_close(ours64, hf_logits(hf.double(), idx), rtol=0, atol=1e-12)
    hf.float()


def test_one_loop_equals_and_disco_loops_differ(pair):
    name, hf, folder = pair
    idx = torch.randint(0, V, (1, T))
    with torch.no_grad():
        base = GPT.from_pretrained(folder)(idx)[0]
        loop1 = GPT.from_pretrained(folder, recurrence="loop", n_loop=1)(idx)[0]
        disco = GPT.from_pretrained(folder, recurrence="disco", n_loop=2)
        two = disco(idx)[0]
        assert torch.equal(loop1, base)
        torch.testing.assert_close(disco(idx, n_loop=1)[0], base, rtol=0, atol=1e-5)  # Stage 1 = the pretrained model
    assert two.shape == base.shape and torch.isfinite(two).all() and (two - base).abs().max() > 1e-3
    copies = GPT.from_pretrained(folder, recurrence="none", n_loop=2)  # two untied copies of the pretrained stack
    assert len(copies.transformer.h) == 2 * copies.config.n_layer


def test_gqa_cached_generation_equals_uncached(tmp_path):
    _, folder = saved("qwen2", tmp_path)  # 4 query heads share 1 key/value head
    model = GPT.from_pretrained(folder, recurrence="disco", n_loop=2)
    seq = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        full = model(seq)[0]
        cache = model.new_cache()
        parts = [model.head(model.hidden(seq[:, :5], cache=cache))]
        parts += [model.head(model.hidden(seq[:, t:t + 1], cache=cache)) for t in range(5, 20)]
    assert cache[0][0].k.size(1) == 1  # the cache holds the kv heads only
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    prompt = seq[:, :4]
    a = model.generate(prompt, 10, temperature=0)
    b = model.generate(prompt, 10, temperature=0, use_cache=False)
    assert torch.equal(a, b)


def test_gqa_trains():
    from model import GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=V, n_layer=1, n_head=4, n_kv_head=2, n_embd=32, n_loop=2,
                          qkv_bias=True, tie_embeddings=False))
    assert model.transformer.h[0].attn.c_attn.weight.shape == (32 + 2 * 16, 32)
    assert list(model.projection_splits().values())[0] == [32, 16, 16]
    idx = torch.randint(0, V, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.transformer.wte.weight.grad is not None
    assert model.lm_head.weight is not model.transformer.wte.weight
    with torch.no_grad():  # untied Phi decodes with the head and encodes with the embedding
        h = torch.randn(2, 5, 32)
        want = torch.softmax(model.transformer.ln_f(h) @ model.lm_head.weight.T, -1) @ model.transformer.wte.weight
        torch.testing.assert_close(model.phi(h), want)


def test_sharded_and_bin_weights(tmp_path):
    hf, folder = saved("llama", tmp_path, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(folder, "model.safetensors.index.json"))
    idx = torch.randint(0, V, (1, T))
    torch.testing.assert_close(GPT.from_pretrained(folder)(idx)[0], hf_logits(hf, idx), rtol=0, atol=1e-4)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text(open(os.path.join(folder, "config.json")).read())
    torch.save({k: v.clone() for k, v in hf.state_dict().items()}, bin_dir / "pytorch_model.bin")
    torch.testing.assert_close(GPT.from_pretrained(str(bin_dir))(idx)[0], hf_logits(hf, idx), rtol=0, atol=1e-4)


def test_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no pretrained model folder at '.*nowhere'"):
        GPT.from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="config.json' not found"):
        GPT.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"model_type='bert' .*not supported.*supported gpt2 .*llama .*qwen2") as e:
        GPT.from_pretrained(str(tmp_path))
    assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(ValueError, match="LlamaForSequenceClassification"):
        GPT.from_pretrained(str(tmp_path))
    _, folder = saved("gpt2", tmp_path)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=f"no weights in '{folder}'"):
        GPT.from_pretrained(folder)
    _, folder = saved("llama", tmp_path)
    with pytest.raises(ValueError, match="n_kv_head=4 conflicts with"):
        GPT.from_pretrained(folder, n_kv_head=4)
    with pytest.raises(ValueError, match="'n_loops' is not a GPTConfig key"):
        GPT.from_pretrained(folder, n_loops=2)
    with pytest.raises(ValueError, match="phi_topk=4 needs tie_embeddings=True"):
        GPT.from_pretrained(folder, recurrence="disco", n_loop=2, phi_topk=4)


def test_train_continues_a_pretrained_folder_as_disco(tmp_path):
    """train.py --init_from=<Hugging Face folder>: the folder's architecture and weights, this config's recurrence
    (DiscoLoop, top-k Phi, K = 2), optimizer and schedule. The first evaluation is the pretrained model's looped
    loss (the run has trained nothing yet) and config.json names what started fresh."""
    import numpy as np
    from conftest import run
    _, folder = saved("llama_tied", tmp_path)  # top-k Phi decodes and encodes with one matrix: a tied head
    d = tmp_path / "shards"
    d.mkdir()
    tokens = np.arange(600) % V
    for split in ("train", "val"):
        tokens.astype(np.uint16).tofile(d / f"{split}_000000.bin")
    (d / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": V, "eot": 0, "encoding": "bytes", "shards": {
        "train": [["train_000000.bin", 600]], "val": [["val_000000.bin", 600]]}}))
    out = str(tmp_path / "run")
    r = run(["train.py", "config/pretrain_tiny.py", f"--data_dir={d}", f"--out_dir={out}", f"--init_from={folder}",
             "--recurrence=disco", "--n_loop=2", "--phi_topk=8", "--block_size=16", "--max_iters=2", "--eval_interval=2",
             "--eval_iters=1", "--dtype=float32", "--threads=1"])
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["n_kv_head"] == 2 and cfg["n_embd"] == 32 and cfg["tie_embeddings"] is True and cfg["recurrence"] == "disco"
    assert cfg["init_kind"] == "Hugging Face llama" and "transformer.ln_inj.weight" in cfg["init_fresh"]
    from checkpoint import load_checkpoint
    assert load_checkpoint(out)["model_args"]["rope_theta"] == GPT.from_pretrained(folder).config.rope_theta == 5000.0


def test_eval_harness_reads_a_pretrained_folder(tmp_path):
    """eval_harness.py --ckpt=<Hugging Face folder>: the model a looped one was continued from, evaluated the same way."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    pytest.importorskip("lm_eval")
    from eval_harness import DiscoLoopLM
    _, folder = saved("llama_tied", tmp_path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "w0"}, f)
    lm = DiscoLoopLM(folder, device="cpu", dtype="float32")
    idx = torch.tensor([lm.tok_encode("w3 w5 w7 w9")])
    assert lm.eot_token_id == 0 and idx.tolist() == [[3, 5, 7, 9]]
    with torch.no_grad():
        assert torch.equal(lm.model(idx)[0], GPT.from_pretrained(folder)(idx)[0])
