"""Round 6 (issue 63): nothing lost and nothing silent. Ownership by a mark, not a name (ownership.owned): a user's file
that has a project file's name, or the key an older check looked for, is never replaced, extended or deleted; an
output that is a named pipe is refused before it is opened (it blocked for ever); a pretrained folder's absurd sizes
are one line before anything is built; an old checkpoint opens; a run branched from a Hugging Face folder resumes with
the command that made it."""
import json
import os

import pytest
import torch

from conftest import REPO, one_line, run, tiny_train_args

from discoloop.checkpoint import load_checkpoint
from discoloop.common import ConfigError
from discoloop.ownership import MARK, owned


def test_overwrite_never_deletes_a_users_checkpoint_named_file(tiny_data, tmp_path):
    out = tmp_path / "run"
    r = run(tiny_train_args(tiny_data, str(out), "--max_iters=2", "--eval_interval=2", "--keep_every=2"))
    assert r.returncode == 0, r.stderr[-2000:]
    (out / "ckpt_007.pt").write_text("a user's notes")  # ckpt_<iter>.pt by name: was deleted by --overwrite=True
    one_line(run(tiny_train_args(tiny_data, str(out), "--max_iters=2", "--overwrite=True")), "ckpt_007.pt",
             "torch cannot read")
    assert (out / "ckpt_007.pt").read_text() == "a user's notes" and (out / "ckpt_2.pt").exists()
    own = tmp_path / "mine"
    own.mkdir()
    (own / "ckpt.pt").write_text("text")  # a user's file named ckpt.pt: was "an earlier run's ckpt.pt"
    (own / "notes.txt").write_text("x")
    r = run(tiny_train_args(tiny_data, str(own), "--max_iters=2", "--overwrite=True"))
    assert r.returncode == 2 and "earlier run" not in r.stderr and (own / "ckpt.pt").read_text() == "text", r.stderr


def test_an_absurd_pretrained_folder_is_one_line_before_building(tmp_path):
    from discoloop.pretrained import pretrained_architecture
    from discoloop.common import weights_fit
    from discoloop.common import DataError
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 100_000_000, "num_attention_heads": 4,
        "max_position_embeddings": 64}))
    with pytest.raises(DataError, match="num_hidden_layers|n_layer=100000000"):
        pretrained_architecture(str(folder))
    arch = dict(n_embd=32, n_layer=2, vocab_size=10 ** 12, n_head=4, n_kv_head=0, n_hidden=0, mlp="gelu",
                tie_embeddings=True)
    with pytest.raises(DataError, match="vocab_size=1000000000000"):
        weights_fit(arch, "config.json", DataError)
    weights_fit({**arch, "vocab_size": 64}, "config.json", limit=10 ** 9)  # a small model fits


def test_an_absurd_vocabulary_in_a_config_is_one_line(tiny_data, tmp_path):
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--vocab_size=1000000000000")),
             "vocab_size=1000000000000", "the model keys")


def test_a_checkpoint_with_a_retired_kernel_opens_with_one_note(tiny_data, tmp_path):
    out = tmp_path / "run"
    r = run(tiny_train_args(tiny_data, str(out), "--max_iters=2", "--eval_interval=2", "--recurrence=disco",
                            "--phi_topk=4"))
    assert r.returncode == 0, r.stderr[-2000:]
    from discoloop.checkpoint import content_crc, load_checkpoint
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    for key in ("model_args", "config"):  # as a commit before the kernel moved to lab/phi.py wrote it
        ck[key]["phi_kernel"] = "dense"
    ck.pop(MARK)
    ck.pop("crc32")
    torch.save({**ck, "crc32": content_crc(ck)}, out / "ckpt.pt")
    for script in (["probe.py", "acc"], ["sample.py", "--start=e1", "--max_new_tokens=2", "--num_samples=1"]):
        r = run(script + [f"--ckpt={out}"])
        assert r.returncode == 0, r.stderr[-2000:]
        notes = [x for x in r.stderr.splitlines() if "phi_kernel='dense'" in x]
        assert len(notes) == 1 and "read as 'auto'" in notes[0], r.stderr
    assert load_checkpoint(str(out / "ckpt.pt"))["model_args"]["phi_kernel"] == "auto"
    r = run(tiny_train_args(tiny_data, str(out), "--max_iters=4", "--eval_interval=2", "--recurrence=disco",
                            "--phi_topk=4", "--init_from=resume"))
    assert r.returncode == 0, r.stderr[-2000:]  # an old run resumes too, its records read as today's


def test_one_rule_for_keys_that_do_nothing(tiny_run, tiny_data, tmp_path):
    """A typed key that would change nothing is refused in one line by every script (train.py's rule), even typed at
    its default; the same keys where they act run."""
    one_line(run(["sample.py", f"--ckpt={tiny_run}", "--start=e1", "--temperature=0", "--top_k=5"]),
             "top_k=5 has no effect", "temperature > 0")
    one_line(run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--dtype=bfloat16"]),
             "dtype='bfloat16' has no effect")
    one_line(run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--compile=True"]),
             "compile=True has no effect")
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "a"), "--eval_iters=3")), "eval_iters=3 has no effect",
             "token shards")
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "b"), "--device=cpu", "--memory_check=True")),
             "memory_check=True has no effect", "CUDA")
    assert run(["sample.py", f"--ckpt={tiny_run}", "--start=e1", "--temperature=0.5", "--top_k=5",
                "--max_new_tokens=2", "--num_samples=1"]).returncode == 0


def test_phi_tau_means_one_thing_for_a_loops_exits():
    """phi_tau is Phi's temperature: a loop decodes no Phi, so its exits read the plain head whatever phi_tau says
    (it changed what an exit measured on a loop run while the key was noted as having no effect there)."""
    from model import GPT, GPTConfig, Exit
    torch.manual_seed(0)
    x = torch.randint(0, 40, (2, 8))
    out = {}
    for tau in (1.0, 0.2):
        torch.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=40, n_layer=1, n_head=2, n_embd=16, block_size=8, recurrence="loop", n_loop=3,
                          phi_tau=tau)).eval()
        with torch.no_grad():
            out[tau] = m.hidden(x, exits=Exit("prob", 0.05, 1))
    a, b = out[1.0], out[0.2]
    a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
    assert torch.equal(a, b)


def test_data_args_encoding_against_shards_that_record_it_alone(tmp_path):
    """Shards whose meta.json says their encoding only at its top (made by hand, no prepare config): a config's
    data_args with another encoding were ignored without a word."""
    import numpy as np
    d = tmp_path / "shards"
    d.mkdir()
    (np.arange(600) % 61).astype(np.uint16).tofile(d / "train_000000.bin")
    (np.arange(600) % 61).astype(np.uint16).tofile(d / "val_000000.bin")
    (d / "meta.json").write_text(json.dumps({"kind": "tokens", "dtype": "uint16", "vocab_size": 61, "eot": 0,
                                             "encoding": "bytes", "shards": {"train": [["train_000000.bin", 600]],
                                                                             "val": [["val_000000.bin", 600]]}}))
    r = run(["train.py", "config/pretrain_tiny.py", f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}",
             "--data_args={'encoding': 'gpt2'}", "--max_iters=0"])
    one_line(r, "encoding='gpt2'", "encoding='bytes'")


def test_the_retired_fused_phi_reads_as_auto_with_one_note(tiny_data, tmp_path):
    """phi_kernel='fused' moved to lab/ (an H200 timed it behind auto): typed, it runs as 'auto' with one note, and the
    checkpoint records 'auto' (compat.RETIRED, as the other retired kernels)."""
    r = run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--recurrence=disco", "--phi_topk=4", "--max_iters=1",
                            "--phi_kernel=fused"), env={"TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-1500:]
    assert [x for x in r.stderr.splitlines() if "phi_kernel='fused'" in x and "read as 'auto'" in x], r.stderr[-1500:]
    assert load_checkpoint(str(tmp_path / "r" / "ckpt.pt"))["model_args"]["phi_kernel"] == "auto"
