import pytest
from hypothesis import given, settings, strategies as st

from discoloop.common import ConfigError
from configurator import configure, parse_value

DEFAULTS = {"batch_size": 64, "learning_rate": 3e-3, "compile": False, "device": "cpu", "recurrence": "disco"}


def test_file_then_overrides(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("import math\nbatch_size = 32\nlearning_rate = 1  # int where float is expected\n_private = 3\n")
    out = configure(DEFAULTS, [str(cfg), "--device=cuda", "--compile=True"])
    assert out == {**DEFAULTS, "batch_size": 32, "learning_rate": 1.0, "device": "cuda", "compile": True}
    assert type(out["learning_rate"]) is float


@pytest.mark.parametrize("argv,needle", [
    (["--batch_sise=3"], "unknown config key 'batch_sise'"),
    (["--batch_sise=3"], "did you mean 'batch_size'"),
    (["--batch_size=3.5"], "batch_size=3.5"),
    (["--compile=1"], "expected bool"),
    (["--learning_rate=fast"], "learning_rate='fast'"),
    (["nope/missing.py"], "config file 'nope/missing.py' not found"),
    (["--batch_size"], "must look like --key=value"),
])
def test_errors_name_the_problem(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        configure(DEFAULTS, argv)


def test_bad_key_in_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("recurence = 'loop'\n")
    with pytest.raises(ConfigError, match="recurence.*did you mean 'recurrence'"):
        configure(DEFAULTS, [str(cfg)])


def test_broken_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("batch_size = = 3\n")
    with pytest.raises(ConfigError, match="SyntaxError"):
        configure(DEFAULTS, [str(cfg)])


values = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                   st.booleans(), st.text(alphabet="abcxyz_-/.", min_size=1, max_size=8))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(DEFAULTS) + ["bogus", "batchsize"]), value=values)
def test_property_override_type_checked(key, value):
    """Any override either lands with the default's type (int accepted for float) or raises
    ConfigError; it never crashes otherwise and never changes another key."""
    arg = f"--{key}={value!r}" if isinstance(value, str) else f"--{key}={value}"
    try:
        out = configure(DEFAULTS, [arg])
    except ConfigError as e:
        assert key in str(e)
        return
    want = type(DEFAULTS[key])
    assert type(out[key]) is want
    expected = float(value) if want is float else (value if want is not str or isinstance(value, str) else arg.split("=", 1)[1])
    assert out[key] == expected
    assert {k: v for k, v in out.items() if k != key} == {k: v for k, v in DEFAULTS.items() if k != key}


def test_parse_value_bare_words():
    assert parse_value("cpu") == "cpu" and parse_value("3") == 3 and parse_value("False") is False


def test_renamed_keys_keep_loading(tmp_path):
    """disco_tau/topk/chunk are phi_* now (Phi drives PonderLM too): old command lines, config files and
    checkpoints load under the new names."""
    import torch
    from discoloop.checkpoint import load_checkpoint, save_checkpoint
    from configurator import configure
    from model import GPT, GPTConfig
    defaults = {"phi_topk": 0, "phi_tau": 1.0, "phi_chunk": 0}
    cfg = tmp_path / "old.py"
    cfg.write_text("disco_tau = 0.5\n")
    c = configure(defaults, [str(cfg), "--disco_topk=4"])
    assert c == {"phi_topk": 4, "phi_tau": 0.5, "phi_chunk": 0}
    old_args = {"vocab_size": 40, "n_layer": 1, "n_head": 2, "n_embd": 16, "recurrence": "disco", "disco_topk": 3}
    from discoloop.compat import renamed  # old names are read where old files are (config files, checkpoints), not by model.py
    assert GPTConfig.from_dict(renamed(old_args)).phi_topk == 3
    path = str(tmp_path / "ckpt.pt")
    weights = GPT(GPTConfig.from_dict(renamed(old_args))).state_dict()
    save_checkpoint({"model": {f"_orig_mod.{k}": v for k, v in weights.items()}, "model_args": old_args,
                     "config": {"disco_chunk": 8}, "dtype": "float32"}, path)  # a whole-model compile's names
    ck = load_checkpoint(path)
    assert ck["model_args"]["phi_topk"] == 3 and "disco_topk" not in ck["model_args"]
    assert ck["model"].keys() == weights.keys() and ck["dtype_resolved"] == "float32" and "dtype" not in ck
    assert ck["config"] == {"phi_chunk": 8}
    assert isinstance(torch.load(path, weights_only=True)["model_args"]["disco_topk"], int)  # the file is as written


def _resolved(argv):
    from discoloop import train_config
    stated = {}
    c = configure(train_config.defaults(), argv, stated=stated)
    return c, train_config.check(c, stated)


@pytest.mark.parametrize("argv,needle", [
    (["config/symbolic.py", "--compile_mode=reduce-overhead"], "compile_mode='reduce-overhead' has no effect: it needs compile=True"),
    (["config/symbolic.py", "--phi_kernel=csr"], "phi_kernel='csr' has no effect: it needs top-k Phi"),
    (["config/symbolic.py", "--recurrence=loop", "--phi_topk=8"], "phi_topk=8 has no effect: it needs a recurrence that decodes Phi"),
    (["config/symbolic.py", "--disco_gate=learned", "--disco_alpha=0.5"], "disco_alpha=0.5 has no effect: it needs disco_gate='fixed'"),
    (["config/symbolic.py", "--muon_momentum=0.9"], "muon_momentum=0.9 has no effect: it needs optimizer='muon'"),
    (["config/symbolic.py", "--decay_lr=False", "--min_lr=1e-5"], "min_lr=1e-05 has no effect: it needs decay_lr=True"),
])
def test_a_typed_key_that_does_nothing_is_refused(argv, needle, capsys):
    """Silent before: a key typed on the command line that the resolved config ignores ran without a word."""
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
        _resolved(argv)
    assert "\n" not in str(e.value) and f"drop --{needle.split('=')[0]}" in str(e.value)


def test_a_file_key_made_inert_by_an_override_is_a_note(capsys):
    """The README's `config/pretrain.py --recurrence=loop` keeps working: the file's Phi keys are one note each,
    and returned for config.json; a key at its default, or one that acts, says nothing."""
    c, inert = _resolved(["config/pretrain.py", "--recurrence=loop"])
    assert sorted(inert) == ["phi_chunk", "phi_topk"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("note: phi_") and "config/pretrain.py" in line for line in err)
    assert _resolved(["config/symbolic.py", "--recurrence=loop"])[1] == {}
    assert _resolved(["config/pretrain.py"])[1] == {} and not capsys.readouterr().err


def test_the_inert_rule_covers_keys_added_later():
    """The rule is over the keys, not a list of pairs: a family prefix covers a key no one listed."""
    from configurator import inert
    from model import GPTConfig
    defaults = {**GPTConfig.defaults(), "phi_new_thing": 0, "compile_new": "x"}
    from discoloop import train_config
    active = {**GPTConfig.ACTIVE, **train_config.ACTIVE}
    config = {**defaults, **train_config.KEYS, "recurrence": "loop", "phi_new_thing": 3, "compile_new": "y"}
    assert set(inert(config, {**defaults, **train_config.KEYS}, active)) == {"phi_new_thing", "compile_new"}
    assert inert({**config, "recurrence": "disco", "compile": True}, {**defaults, **train_config.KEYS}, active) == {}


def test_a_parent_is_found_beside_the_file_that_names_it(tmp_path, monkeypatch):
    """A user's config that execs config/pretrain_tiny.py (which execs its own parent by sibling) works from the
    repo and beside the user's file alike; a missing parent and a cycle are one line."""
    from conftest import REPO
    mine = tmp_path / "mine.py"
    mine.write_text('exec(open("config/pretrain_tiny.py").read())\nn_embd = 64\n')
    monkeypatch.chdir(REPO)
    c, _ = _resolved([str(mine)])
    assert c["n_embd"] == 64 and c["dataset"] == "pretrain" and c["phi_topk"] == 32  # pretrain_tiny's over pretrain's
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "pretrain_tiny.py").write_text('exec(open(sibling("base.py")).read())\nn_layer = 3\n')
    (tmp_path / "config" / "base.py").write_text('n_head = 8\n')
    monkeypatch.chdir(tmp_path.parent)  # beside the naming file first, wherever the command runs
    c, _ = _resolved([str(mine)])
    assert (c["n_layer"], c["n_head"], c["n_embd"]) == (3, 8, 64)
    (tmp_path / "a.py").write_text('exec(open("b.py").read())\n')
    (tmp_path / "b.py").write_text('exec(open(sibling("a.py")).read())\n')
    (tmp_path / "m.py").write_text('exec(open("nothere.py").read())\n')
    with pytest.raises(ConfigError, match="cycle: .*a.py -> .*b.py -> .*a.py"):
        _resolved([str(tmp_path / "a.py")])
    with pytest.raises(ConfigError, match="names a parent 'nothere.py' that is neither beside it"):
        _resolved([str(tmp_path / "m.py")])
