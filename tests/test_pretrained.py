"""pretrained.from_pretrained: tiny random GPT-2, Llama (grouped-query, tied and untied) and Qwen2 (q, k, v biases) models
built locally with transformers (no download), saved with save_pretrained, load with logits equal to transformers'
own: float32 to 1e-4, float64 to 1e-12. Plus looping a pretrained stack, cached generation with GQA, and the
one-line errors."""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from discoloop.common import ConfigError, DataError  # noqa: E402
from discoloop.pretrained import from_pretrained  # noqa: E402

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
    model = from_pretrained(folder)
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
        base = from_pretrained(folder)(idx)[0]
        loop1 = from_pretrained(folder, recurrence="loop", n_loop=1)(idx)[0]
        disco = from_pretrained(folder, recurrence="disco", n_loop=2)
        two = disco(idx)[0]
        assert torch.equal(loop1, base)
        torch.testing.assert_close(disco(idx, n_loop=1)[0], base, rtol=0, atol=1e-5)  # Stage 1 = the pretrained model
    assert two.shape == base.shape and torch.isfinite(two).all() and (two - base).abs().max() > 1e-3
    copies = from_pretrained(folder, recurrence="none", n_loop=2)  # two untied copies of the pretrained stack
    assert len(copies.transformer.h) == 2 * copies.config.n_layer


def test_gqa_cached_generation_equals_uncached(tmp_path):
    _, folder = saved("qwen2", tmp_path)  # 4 query heads share 1 key/value head
    model = from_pretrained(folder, recurrence="disco", n_loop=2)
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
    from model import GPT, GPTConfig
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
    torch.testing.assert_close(from_pretrained(folder)(idx)[0], hf_logits(hf, idx), rtol=0, atol=1e-4)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text(open(os.path.join(folder, "config.json")).read())
    torch.save({k: v.clone() for k, v in hf.state_dict().items()}, bin_dir / "pytorch_model.bin")
    torch.testing.assert_close(from_pretrained(str(bin_dir))(idx)[0], hf_logits(hf, idx), rtol=0, atol=1e-4)


def test_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="no pretrained model folder at '.*nowhere'"):
        from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="config.json' not found"):
        from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(DataError, match=r"model_type='bert' .*not supported.*supported gpt2 .*llama .*qwen2") as e:
        from_pretrained(str(tmp_path))
    assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(DataError, match="LlamaForSequenceClassification"):
        from_pretrained(str(tmp_path))
    _, folder = saved("gpt2", tmp_path)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(DataError, match=f"no weights in '{folder}'"):
        from_pretrained(folder)
    _, folder = saved("llama", tmp_path)
    with pytest.raises(ConfigError, match="n_kv_head=4 conflicts with .*config.json, which has n_kv_head=2"):
        from_pretrained(folder, n_kv_head=4)
    with pytest.raises(ConfigError, match="sandwich_norm=True conflicts with .*sandwich_norm=False"):
        from_pretrained(folder, sandwich_norm=True)  # extra norms: another function of the same weights
    with pytest.raises(ConfigError, match="'n_loops' is not a GPTConfig key"):
        from_pretrained(folder, n_loops=2)
    with pytest.raises(ValueError, match="phi_topk=4 needs tie_embeddings=True"):
        from_pretrained(folder, recurrence="disco", n_loop=2, phi_topk=4)


def edited(folder, tmp_path, name, **files):
    """A copy of a saved folder with some files replaced: {file name: text, bytes, or None to delete}."""
    import shutil
    out = str(tmp_path / name)
    shutil.copytree(folder, out)
    for f, content in files.items():
        path = os.path.join(out, f.replace("__", "."))
        if content is None:
            os.remove(path)
        elif isinstance(content, bytes):
            open(path, "wb").write(content)
        else:
            open(path, "w").write(content)
    return out


def test_whatever_is_wrong_inside_a_folder_is_one_line_naming_the_file(tmp_path):
    """The folder's config.json of the wrong shape or type, a truncated or pickled weights file, an index that names
    no files, weights that do not fit: a DataError of one line naming the file, never a traceback."""
    import argparse
    hf, folder = saved("llama", tmp_path)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    weights = open(os.path.join(folder, "model.safetensors"), "rb").read()
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    pickled = tmp_path / "pickled.bin"
    torch.save({**sd, "args": argparse.Namespace(lr=1)}, pickled)  # a pickled object that is not a tensor
    bad_shape = {**sd, "model.layers.0.self_attn.k_proj.weight": torch.zeros(3, 5)}
    torch.save(bad_shape, tmp_path / "bad_shape.bin")
    torch.save({**sd, "model.norm.weight": sd["model.norm.weight"].to(torch.int32)}, tmp_path / "ints.bin")
    probes = {  # name: (files to replace, the file the message must name, what it must say)
        "list": ({"config__json": "[1, 2]"}, "config.json", "holds a JSON list"),
        "string": ({"config__json": '"llama"'}, "config.json", "holds a JSON str"),
        "not_json": ({"config__json": "{'model_type': llama"}, "config.json", "is not valid JSON"),
        "type": ({"config__json": json.dumps({**cfg, "num_hidden_layers": "two"})}, "config.json",
                 "num_hidden_layers='two' is invalid: allowed an integer >= 1"),
        "rope": ({"config__json": json.dumps({**cfg, "rope_parameters": "fast", "rope_scaling": None})}, "config.json",
                 "rope_parameters='fast' is invalid"),
        "eps": ({"config__json": json.dumps({**cfg, "rms_norm_eps": "small"})}, "config.json", "rms_norm_eps='small'"),
        "heads": ({"config__json": json.dumps({**cfg, "num_attention_heads": 0})}, "config.json",
                  "num_attention_heads=0 is invalid"),
        "kv": ({"config__json": json.dumps({**cfg, "num_key_value_heads": 3})}, "config.json", "n_kv_head=3 is invalid"),
        "truncated": ({"model__safetensors": weights[:len(weights) // 2]}, "model.safetensors",
                      "is not a readable weights file"),
        "pickled": ({"model__safetensors": None, "pytorch_model__bin": open(pickled, "rb").read()}, "pytorch_model.bin",
                    "holds pickled objects other than plain tensors, which are refused"),
        "index": ({"model__safetensors__index__json": json.dumps({"weight_map": ["model.safetensors"]})},
                  "model.safetensors.index.json", "has no weight_map of file names"),
        "shapes": ({"model__safetensors": None, "pytorch_model__bin": open(tmp_path / "bad_shape.bin", "rb").read()},
                   "pytorch_model.bin", "do not fit"),
        "ints": ({"model__safetensors": None, "pytorch_model__bin": open(tmp_path / "ints.bin", "rb").read()},
                 "pytorch_model.bin", "is torch.int32, allowed floating-point weights"),
        "scaling": ({"config__json": json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})},
                    "config.json", "rope_scaling with rope_type='llama3'"),  # Llama 3.1's: not plain RoPE
    }
    for name, (files, where, what) in probes.items():
        with pytest.raises(DataError) as e:
            from_pretrained(edited(folder, tmp_path, name, **files))
        msg = str(e.value)
        assert "\n" not in msg and where in msg and what in msg and "weights_only=False" not in msg, (name, msg)


def test_the_folder_decides_its_architecture():
    """Every GPTConfig key is either the architecture (the folder's: each converter gives exactly those) or a key a
    continuation may set, listed once; a new model key must be put in one of the two."""
    from model import GPTConfig
    from discoloop.pretrained import ARCH_KEYS, CONTINUE_KEYS, PRETRAINED
    assert set(CONTINUE_KEYS) <= set(GPTConfig.defaults()) and len(set(CONTINUE_KEYS)) == len(CONTINUE_KEYS)
    assert set(ARCH_KEYS) | set(CONTINUE_KEYS) == set(GPTConfig.defaults()) and "sandwich_norm" in ARCH_KEYS
    hf = {"vocab_size": V, "n_positions": 32, "n_layer": 2, "n_head": 4, "n_embd": 32, "max_position_embeddings": 64,
          "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48}
    for kind, (_, config_of, _) in PRETRAINED.items():
        assert set(config_of({**hf, "model_type": kind}, "config.json")) == {*ARCH_KEYS, "block_size"}, kind


@pytest.mark.parametrize("name, folder_config", [
    ("smollm2_continue.py", dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_hidden_layers=30,
                                 num_key_value_heads=3, rms_norm_eps=9.999999747378752e-06, rope_theta=100000.0)),
    ("smollm2_1.7b_continue.py", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                      num_hidden_layers=24, num_key_value_heads=32, rms_norm_eps=1e-05,
                                      rope_theta=130000.0))])
def test_smollm2_configs_agree_with_their_folders(tmp_path, name, folder_config):
    """config/smollm2*_continue.py state their folder's architecture (so that bench.py plans them without weights):
    what they state is what the folder says (the 135M folder, converted from GGUF's float32 metadata, says
    rms_norm_eps 9.999999747378752e-06: read as the 1e-05 it stands for), so train.py does not refuse them."""
    from discoloop import train_config
    from configurator import configure
    from discoloop.pretrained import pretrained_architecture
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_act": "silu",
        "max_position_embeddings": 8192, "tie_word_embeddings": True, **folder_config}))
    _, arch, _, _ = pretrained_architecture(str(tmp_path))
    stated = {}
    config = configure(train_config.defaults(), [os.path.join("config", name)], stated=stated)
    stated = set(stated)
    assert stated & set(arch) and {k: config[k] for k in stated & set(arch)} == {k: arch[k] for k in stated & set(arch)}


def shards(tmp_path):
    import numpy as np
    d = tmp_path / "shards"
    d.mkdir()
    tokens = np.arange(600) % V
    for split in ("train", "val"):
        tokens.astype(np.uint16).tofile(d / f"{split}_000000.bin")
    (d / "meta.json").write_text(json.dumps({"kind": "tokens", "dtype": "uint16", "vocab_size": V, "eot": 0, "encoding": "bytes", "shards": {
        "train": [["train_000000.bin", 600]], "val": [["val_000000.bin", 600]]}}))
    return d


def test_train_continues_a_pretrained_folder_as_disco_and_resumes(tmp_path):
    """train.py --init_from=<Hugging Face folder>: the folder's architecture and weights, this command's recurrence
    (DiscoLoop, top-k Phi, K = 2), optimizer and schedule; config.json names what started fresh. The same command
    with --init_from=resume continues it (the architecture the command does not state is the checkpoint's, and the
    eps it states, 1e-05, is the folder's float32 9.999999747378752e-06). An architecture key stated at another value,
    on the command line or in a config file, is one line naming both values."""
    from conftest import run
    hf, folder = saved("llama_tied", tmp_path)  # top-k Phi decodes and encodes with one matrix: a tied head
    cfg = json.load(open(os.path.join(folder, "config.json")))
    json.dump({**cfg, "rms_norm_eps": 9.999999747378752e-06}, open(os.path.join(folder, "config.json"), "w"))
    out = str(tmp_path / "run")
    args = ["train.py", "--dataset=pretrain", f"--data_dir={shards(tmp_path)}", f"--out_dir={out}", "--recurrence=disco",
            "--n_loop=2", "--phi_topk=8", "--block_size=16", "--batch_size=4", "--eval_interval=2", "--eval_iters=1",
            "--dtype=float32", "--threads=1", "--norm_eps=1e-5", "--warmup_iters=1"]
    r = run(args + [f"--init_from={folder}", "--max_iters=2"])
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["n_kv_head"] == 2 and cfg["n_embd"] == 32 and cfg["tie_embeddings"] is True and cfg["recurrence"] == "disco"
    assert cfg["init_kind"] == "Hugging Face llama" and "transformer.ln_inj.weight" in cfg["init_fresh"]
    from discoloop.checkpoint import load_checkpoint
    assert load_checkpoint(out)["model_args"]["rope_theta"] == from_pretrained(folder).config.rope_theta == 5000.0
    r = run(args + ["--init_from=resume", "--max_iters=4"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(out)["iter_num"] == 4
    r = run(args + ["--sandwich_norm=True", f"--init_from={folder}", f"--out_dir={tmp_path / 'other'}"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert all(b in r.stderr for b in ("sandwich_norm=True", "sandwich_norm=False", "conflicts with")), r.stderr
    # nanoGPT's init_from: a config FILE's architecture gives way to the folder's, one line per replaced key
    r = run(args[:1] + ["config/pretrain_tiny.py"] + args[1:] + [f"--init_from={folder}", "--max_iters=0",
                                                                  f"--out_dir={tmp_path / 'other'}"])
    assert r.returncode == 0, r.stderr[-2000:]
    notes = [line for line in r.stderr.splitlines() if "the folder decides its architecture" in line]
    assert any(line.startswith("note: n_embd=32 from") and "replaces n_embd=128 of config/pretrain_tiny.py" in line
               for line in notes), r.stderr[-2000:]
    cfg = json.load(open(tmp_path / "other" / "config.json"))
    assert cfg["n_embd"] == 32 and cfg["init_replaced"]["n_embd"] == [128, 32] and len(notes) == len(cfg["init_replaced"])


def test_eval_harness_reads_a_pretrained_folder(tmp_path):
    """eval_harness.py --ckpt=<Hugging Face folder>: the model a looped one was continued from, evaluated the same way;
    without tokenizer_config.json the end of text is '<|endoftext|>'; a tokenizer with more tokens than the model has
    rows is one line naming both sizes, before the weights are read."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    pytest.importorskip("lm_eval")
    from conftest import run
    from eval_harness import DiscoLoopLM
    _, folder = saved("llama_tied", tmp_path)

    def tokenizer(n):
        tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, n)}}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(os.path.join(folder, "tokenizer.json"))
    tokenizer(V)
    lm = DiscoLoopLM(folder, device="cpu", dtype="float32")
    idx = torch.tensor([lm.tok_encode("w3 w5 w7 w9")])
    assert lm.eot_token_id == 0 and idx.tolist() == [[3, 5, 7, 9]]
    with torch.no_grad():
        assert torch.equal(lm.model(idx)[0], from_pretrained(folder)(idx)[0])
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "w9"}, f)
    assert DiscoLoopLM(folder, device="cpu", dtype="float32").eot_token_id == 9
    tokenizer(V + 5)
    os.remove(os.path.join(folder, "model.safetensors"))  # never reached: the tokenizer is refused first
    before = sorted(os.listdir(folder))
    from conftest import REPO
    r = run([os.path.join(REPO, "eval_harness.py"), f"--ckpt={folder}", "--tasks=piqa"], cwd=tmp_path)
    want = os.path.join("out", "results", os.path.basename(folder), "eval_harness.json")  # the project's, said
    assert r.returncode == 2 and f"not a run folder, so not ours to write into: eval_harness.json goes to {want}" \
        in r.stderr and os.path.isdir(tmp_path / os.path.dirname(want)), r.stderr[-2000:]
    r = run(["eval_harness.py", f"--ckpt={folder}", "--tasks=piqa", f"--json={tmp_path / 'eval.json'}"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"has {V + 5} tokens, more than the model's vocab_size={V}" in r.stderr, r.stderr
    assert sorted(os.listdir(folder)) == before  # nothing written into someone's model folder


@pytest.mark.parametrize("name", ["gpt2", "llama_tied"])
def test_a_tied_folder_that_stores_its_own_head_loads_as_transformers_does(tmp_path, capsys, name):
    """config.json says tie_word_embeddings=true but the weights hold their own lm_head.weight: transformers keeps it
    (untied, with a warning); so do we, with one warning line (dropping it made logits differ by up to 25)."""
    from safetensors.torch import load_file, save_file
    _, folder = saved(name, tmp_path)
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    torch.manual_seed(1)
    sd["lm_head.weight"] = torch.randn(V, 32)
    save_file(sd, path, metadata={"format": "pt"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    capsys.readouterr()
    model = from_pretrained(folder)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning:") and "loaded untied, as transformers does" in err[0]
    assert not model.config.tie_embeddings
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf_logits(hf, idx), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="phi_topk=4 needs tie_embeddings=True"):  # a library caller's except
        from_pretrained(folder, recurrence="disco", phi_topk=4)


def test_nanogpt_entry_point_and_library_errors(tmp_path):
    """A nanoGPT forker's GPT.from_pretrained loads a folder (through pretrained.py); model.py copied alone still
    imports, and the call is one clear ImportError there; every error of the library is a ValueError."""
    import subprocess
    import sys
    from discoloop.common import ERRORS
    from conftest import REPO
    from model import GPT
    _, folder = saved("llama", tmp_path)
    idx = torch.randint(0, V, (1, T))
    with torch.no_grad():
        assert torch.equal(GPT.from_pretrained(folder, override_args={"dropout": 0.0})(idx)[0], from_pretrained(folder)(idx)[0])
    assert all(issubclass(e, ValueError) for e in ERRORS)
    for bad in (dict(n_embd=64), dict(bogus=1)):
        with pytest.raises(ValueError):
            GPT.from_pretrained(folder, **bad)
    with pytest.raises(ValueError, match="no pretrained model folder"):
        GPT.from_pretrained(str(tmp_path / "none"))
    alone = tmp_path / "alone"
    alone.mkdir()
    for f in ("model.py", "kernels.py", "muon.py"):
        (alone / f).write_text(open(os.path.join(REPO, f)).read())
    code = "from model import GPT\ntry:\n    GPT.from_pretrained('x')\nexcept ImportError as e:\n    print(e)"
    r = subprocess.run([sys.executable, "-c", code], cwd=alone, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0 and "No module named 'discoloop'" in r.stdout, r.stderr[-2000:]
