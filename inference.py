"""
A trained checkpoint opened for the scripts that use one (sample.py, eval_harness.py, probe.py, bench.py sample,
export_hf.py; training never imports this): the model with its weight average, its tokenizer, where results go by
default, and the adaptive-depth keys (model.Exit).
"""
import os
import sys

from common import CheckpointError, ConfigError, DataError, read_json
from configurator import INT_GE1
from datafolder import kind_of, owner, read_meta
from model import GPT, Exit, GPTConfig
from tokenizer import HFEncoding, WordVocab, from_record, get_encoding


def model_from_checkpoint(ckpt, use_ema=True, **overrides):
    """Rebuild the GPT of a checkpoint (its weight average when it has one and use_ema);
    overrides (e.g. disco_alpha) change config fields."""
    try:
        config = GPTConfig.from_dict({**ckpt["model_args"], **overrides})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint model config is invalid: {e}") from None
    model = GPT(config)
    weights = ckpt["ema"] if use_ema and "ema" in ckpt else ckpt["model"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint does not match its config: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return model


def tokenizer_for(ckpt):
    """The tokenizer a checkpoint was trained with: its own record (train.py stores one), else for older
    checkpoints the data config's encoding (token shards) or the data folder's vocabulary (question-answer)."""
    data_config = ckpt.get("data_config", {})
    if "tokenizer" in ckpt:
        return from_record(ckpt["tokenizer"], data_config)
    if "encoding" in data_config:
        return get_encoding(data_config)
    return WordVocab(read_meta(ckpt["config"]["data_dir"])["vocab"])


def check_vocab(n_tokens, vocab_size, where):
    """A model can read every id of its tokenizer (more rows than tokens is fine: vocab_size pads the data's)."""
    if n_tokens > vocab_size:
        raise DataError(f"{where}: its tokenizer has {n_tokens} tokens, more than the model's vocab_size={vocab_size}: "
                        f"ids past {vocab_size - 1} have no embedding row (not this model's tokenizer)")


def trained_on_tokens(ckpt):
    """Its tokenizer's record says (a question set's is its word vocabulary 'words'); without one, the folder it was
    trained on; without that, its data config (a token run's names its encoding)."""
    rec = ckpt.get("tokenizer") or {}
    if "kind" in rec:
        return rec["kind"] != "words"
    try:
        return kind_of(read_meta(ckpt["config"]["data_dir"])) == "tokens"
    except DataError:
        return "encoding" in ckpt.get("data_config", {})


def checkpoint_tokenizer(ckpt, where="the checkpoint"):
    """The tokenizer a checkpoint was trained with (tokenizer_for), refused in one line when it has ids
    the model has no embedding row for. A model larger than its tokenizer is fine (vocab_size pads the data's)."""
    enc = tokenizer_for(ckpt)
    check_vocab(enc.n_vocab, ckpt["model_args"]["vocab_size"], where)
    return enc


def folder_tokenizer(folder, vocab_size):
    """The tokenizer a Hugging Face folder carries (tokenizer.json; its end of text is tokenizer_config.json's
    eos_token, '<|endoftext|>' when that file or key is absent), refused in one line when it has ids past the
    model's vocab_size."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise DataError(f"'{folder}' has no tokenizer.json: a Hugging Face folder is read with its own tokenizer")
    tok_config = os.path.join(folder, "tokenizer_config.json")
    eos = read_json(tok_config).get("eos_token") if os.path.isfile(tok_config) else None
    if isinstance(eos, dict):  # an AddedToken written out: {"content": "<|endoftext|>", ...}
        eos = eos.get("content")
    enc = HFEncoding(path, eos if isinstance(eos, str) else "<|endoftext|>")
    check_vocab(enc.n_vocab, vocab_size, path)
    return enc


def beside_checkpoint(ckpt, name, key="json"):
    """Where a probe or an evaluation of `ckpt` (a run folder or a checkpoint file in one) writes `name` by default:
    into that run folder, train.py's (claim); a Hugging Face or any other folder is not ours to write into, so
    out/results/<its name>/ under the current folder (the project's output root), made now and said in one line."""
    folder = ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt) or "."
    who = owner(folder) if os.path.exists(ckpt) else "train.py"  # a missing checkpoint: its reader's one line
    if who == "train.py":
        return os.path.join(folder, name)
    own = os.path.join("out", "results", os.path.basename(os.path.abspath(folder)))
    try:
        os.makedirs(own, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot make '{own}' for {name} ({e.strerror}): pass --{key}=FILE") from None
    path = os.path.join(own, name)
    print(f"note: '{folder}' is {f'a folder of {who}' if who else 'empty'}, not a run folder, so not ours to write "
          f"into: {name} goes to {path} (--{key}=FILE chooses)", file=sys.stderr)
    return path


def check_own_result(path, keys, script):
    """An existing --json file is replaced only when it is `script`'s result (a JSON object with these keys): a user's
    file, a run's config.json or a dataset's meta.json never is (the hostile pass: each was overwritten)."""
    if path and os.path.exists(path) and (not os.path.isfile(path) or os.path.getsize(path)):
        try:
            obj = read_json(path)
        except DataError:
            obj = None
        if not (isinstance(obj, dict) and set(keys) <= set(obj)):
            raise ConfigError(f"json={path!r} holds no result of {script} (only one of its results is replaced): "
                              "choose another path")


# the scripts' adaptive-depth keys (sample.py, eval_harness.py, probe.py, bench.py sample): model.Exit
EXIT_KEYS = dict(
    exit_rule="",          # adaptive depth: '' = off (every token runs every loop), 'prob' or 'kl' (model.Exit)
    exit_threshold=0.9,    # 'prob': exit once the top probability >= this (0..1); 'kl': once KL(loop k-1 || k) <= this
    exit_min_loops=1,      # no token exits before this many loops
)
# their checks, one each (the threshold's range depends on the rule: model.Exit checks it)
EXIT_CHECKS = {"exit_rule": (lambda v: v in ("", "prob", "kl"), "'' (off), 'prob' or 'kl'"), "exit_min_loops": INT_GE1}


def exit_option(rule, threshold, min_loops, model, n_loop=None):
    """model.Exit for the scripts' exit_* keys (None when exit_rule is ''); one ConfigError line for a bad value, exits
    on recurrence='none', a threshold or minimum with exits off, or too few loops for any token to exit."""
    if not rule:
        given = {k: v for k, v in (("exit_threshold", threshold), ("exit_min_loops", min_loops)) if float(v) != EXIT_KEYS[k]}
        if given:
            raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())} {'has' if len(given) == 1 else 'have'} "
                              "no effect with exits off: exit_rule='prob' or 'kl' turns exits on")
        return None
    if model.rec.copies:
        raise ConfigError(f"exit_rule={rule!r} is invalid for recurrence='none' (K untied copies, not loops): allowed ''")
    K = n_loop or model.config.n_loop
    if rule == "kl" and K < 3:  # kl compares loops k-1 and k, and a token exits after a loop k < K
        raise ConfigError(f"exit_rule='kl' compares loops k-1 and k and needs n_loop >= 3 (n_loop={K}): use 'prob'")
    if K < 2 or int(min_loops) >= K:  # a token exits after a loop k < K
        raise ConfigError(f"exit_rule={rule!r} needs at least 2 loops (n_loop={K})" if K < 2 else
                          f"exit_min_loops={min_loops} leaves no loop to exit after with {K} loops: allowed 1..{K - 1}")
    try:
        return Exit(rule, float(threshold), int(min_loops))
    except ValueError as e:
        raise ConfigError(str(e)) from None
