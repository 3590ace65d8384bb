"""
A trained checkpoint opened for the scripts that use one (sample.py, eval_harness.py, probe.py, exits.py, bench.py
sample, export_hf.py; training never imports this): the model with its weight average, its tokenizer, the dataset it
was trained on (probe.py, exits.py), where results go by default, and the adaptive-depth keys (model.Exit) with the
learned exit's gate (ExitGate; exits.py gate trains it).
"""
import dataclasses
import math
import os
import sys

import torch
import torch.nn as nn

from discoloop.checkpoint import config_mismatch, content_crc, load_checkpoint, sizes_match
from discoloop.common import CheckpointError, ConfigError, DataError, not_regular, read_json
from discoloop.ownership import MARK
from discoloop.compat import OLD_GATE_FILE
from configurator import INT_GE1
from discoloop.folder_owner import owner
from discoloop.data_meta import kind_of, read_meta
from model import COMPUTE_KEYS, EXIT_RULES, GPT, Exit, GPTConfig
from discoloop.tokenizer import HFEncoding, WordVocab, from_record, get_encoding


def runnable_here(args, where):
    """model_args with each compute-only key (model.COMPUTE_KEYS) this machine cannot run read as its default: a
    checkpoint trained on a GPU opens anywhere, one note per key naming it and the file."""
    for key, (default, runs) in COMPUTE_KEYS.items():
        if key in args and not runs(args[key]):
            print(f"note: '{where}' was trained with {key}={args[key]!r} (compute only, no weight depends on it), which "
                  f"this machine cannot run: read as {default!r}", file=sys.stderr)
            args = {**args, key: default}
    return args


def model_from_checkpoint(ckpt, use_ema=True, **overrides):
    """Rebuild the GPT of a checkpoint (its weight average when it has one and use_ema);
    overrides (e.g. disco_alpha) change config fields. The sizes are checked against the weights before building."""
    where = ckpt.get("path", "the checkpoint")
    weights = ckpt["ema"] if use_ema and "ema" in ckpt else ckpt["model"]
    args = runnable_here({**ckpt["model_args"], **overrides}, where)
    try:
        config = GPTConfig.from_dict(args)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"'{where}': its model config is invalid: {e}") from None
    sizes_match(dataclasses.asdict(config), weights, where)
    model = GPT(config)
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


def load(ckpt_path, data_dir=None, raw=False, tokens_ok=False, split="val"):
    """(model, data) of a checkpoint and the dataset it was trained on (probe.py, exits.py): qa_data.QAData, or where
    `tokens_ok` (exits.py) a pretraining run's `split` shards (shards.TokenShards). data_dir (default: the checkpoint's
    own) must hold the kind of data and the tokens the model was trained on; its meta.json is read once, here."""
    ckpt = load_checkpoint(ckpt_path)
    made = ckpt.get("data_config", {})
    tokens = trained_on_tokens(ckpt)
    if tokens and not tokens_ok:
        raise CheckpointError(f"'{ckpt_path}' was trained on token shards: probe.py probes question-answer checkpoints "
                              "(symbolic, nl); evaluate it with eval_harness.py, its exits with exits.py")
    data_dir = data_dir or ckpt["config"]["data_dir"]
    meta = read_meta(data_dir)
    if kind_of(meta) != ("tokens" if tokens else "qa"):  # the folder says what it is
        raise DataError(f"data_dir='{data_dir}' is not a {'token shard' if tokens else 'question-answer'} dataset "
                        f"({kind_of(meta)!r} data): the checkpoint was trained on one")
    if tokens:  # the same token ids: encoding, tokenizer file, tokenizer hash
        from discoloop.shards import TokenShards  # here: a script that samples loads no dataset reader
        data = TokenShards(data_dir, split, meta)
        why = config_mismatch(made, meta.get("config", {}), ["encoding", "tiktoken_file", "tokenizer_file",
                                                             "tokenizer_sha256"])
    else:
        from discoloop.qa_data import QAData  # here: a script that samples loads no dataset reader
        data = QAData(data_dir, meta=meta)
        why = config_mismatch(made, meta["config"], list(meta["config"]))
    if why or data.vocab_size > ckpt["model_args"]["vocab_size"]:
        raise CheckpointError(f"checkpoint was trained on another dataset than '{data_dir}' "
                              f"({why or 'vocabulary size differs'})")
    if raw and "ema" not in ckpt:
        print(f"note: '{ckpt_path}' has no weight average: --raw=True changes nothing", file=sys.stderr)
    return model_from_checkpoint(ckpt, use_ema=not raw).eval(), data


def lead_pads(data, X):
    """The '_' tokens each question-answer row starts with (data/symbolic/prepare.py's pad_left, training splits;
    else 0)."""
    if not data.meta["config"].get("pad_left"):
        return torch.zeros(len(X), dtype=torch.long)
    return (X == data.stoi["_"]).long().cumprod(1).sum(1)


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


# what each loop's attention reads for earlier positions, at inference (sample.py, eval_harness.py): model.KV_SHARES
KV_KEYS = dict(kv_share="checkpoint")  # 'checkpoint' = what it was trained with; '', 'first' or 'latest' (Huginn's)
KV_CHECKS = {"kv_share": (lambda v: v in ("checkpoint", "", "first", "latest"),
                          "'checkpoint' (its own), '' (each loop its own), 'first' (loop 1's) or 'latest' (the last "
                          "loop each position wrote)")}


def kv_override(kv_share, use_cache=True):
    """model_from_checkpoint's override for the kv_share key ({} for the checkpoint's own); 'latest' without the
    cache is refused (it is what a cache keeps: a forward over the whole prefix reads each loop's own)."""
    if kv_share == "latest" and not use_cache:
        raise ConfigError("kv_share='latest' reads what the cache kept of earlier positions: allowed use_cache=True")
    return {} if kv_share == "checkpoint" else {"kv_share": kv_share}


# the scripts' adaptive-depth keys (sample.py, eval_harness.py, exits.py, bench.py sample): model.Exit
EXIT_KEYS = dict(
    exit_rule="",          # adaptive depth: '' = off (every token runs every loop), 'prob', 'kl' or 'gate' (model.Exit)
    exit_threshold=-1.0,   # -1 = the rule's own (0.9; 'gate': the calibrated one in its file). 'prob': exit once the top
                           # probability >= this (0..1); 'kl': once KL(loop k-1 || k) <= this; 'gate': once its score >= this
    exit_min_loops=1,      # no token exits before this many loops
)
# their checks, one each (the threshold's range depends on the rule: model.Exit checks it)
EXIT_CHECKS = {"exit_rule": (lambda v: v in ("", *EXIT_RULES), f"'' (off) or one of {EXIT_RULES}"),
               "exit_min_loops": INT_GE1}


def exit_option(rule, threshold, min_loops, model, n_loop=None, ckpt=None):
    """model.Exit for the scripts' exit_* keys (None when exit_rule is ''); one ConfigError line for a bad value, exits
    on recurrence='none', a threshold or minimum with exits off, or too few loops for any token to exit. 'gate' reads
    the gate trained beside checkpoint `ckpt` (a run folder or checkpoint file; exits.py gate) for this very model."""
    if not rule:
        given = {k: v for k, v in (("exit_threshold", threshold), ("exit_min_loops", min_loops)) if float(v) != EXIT_KEYS[k]}
        if given:
            raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())} {'has' if len(given) == 1 else 'have'} "
                              "no effect with exits off: exit_rule='prob', 'kl' or 'gate' turns exits on")
        return None
    if model.rec.copies:
        raise ConfigError(f"exit_rule={rule!r} is invalid for recurrence='none' (K untied copies, not loops): allowed ''")
    K = n_loop or model.config.n_loop
    if rule == "kl" and K < 3:  # kl compares loops k-1 and k, and a token exits after a loop k < K
        raise ConfigError(f"exit_rule='kl' compares loops k-1 and k and needs n_loop >= 3 (n_loop={K}): use 'prob'")
    if K < 2 or int(min_loops) >= K:  # a token exits after a loop k < K
        raise ConfigError(f"exit_rule={rule!r} needs at least 2 loops (n_loop={K})" if K < 2 else
                          f"exit_min_loops={min_loops} leaves no loop to exit after with {K} loops: allowed 1..{K - 1}")
    score = None
    if rule == "gate":
        gate, rec = load_gate(ckpt, model)
        score = gate.score(model)
        if float(threshold) == -1 and (rec["K"], rec["min_loops"]) != (K, int(min_loops)):
            print(f"note: the gate's threshold {rec['threshold']:.4g} was calibrated with n_loop={rec['K']}, min_loops="
                  f"{rec['min_loops']} (bound {rec['bound']:g}); with n_loop={K}, min_loops={min_loops} that bound is "
                  "not measured", file=sys.stderr)
        threshold = rec["threshold"] if float(threshold) == -1 else threshold
    try:
        return Exit(rule, 0.9 if float(threshold) == -1 else float(threshold), int(min_loops), score=score)
    except ValueError as e:
        raise ConfigError(str(e)) from None


GATE_SUFFIX = ".exit_gate.pt"  # ckpt.pt's gate is ckpt.exit_gate.pt, ckpt_500.pt's ckpt_500.exit_gate.pt (exits.py gate)
OTHER_GATE_SUFFIX = ".gate.pt"  # a checkpoint not named *.pt keeps its whole name: ckpt.bak's is ckpt.bak.gate.pt
GATE_KEYS = ("gate", "crc32", "model_args", "of", "K", "min_loops", "bound", "threshold")  # what load_gate reads
_WHOLE = (lambda v: type(v) is int and v >= 0, "an integer >= 0")
_NUMBER = (lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number")
GATE_TYPES = {"crc32": _WHOLE, "K": _WHOLE, "min_loops": _WHOLE, "bound": _NUMBER, "threshold": _NUMBER}


GATE_FEATURES = {  # exits.py --gate_features: what the learned exit reads, one linear layer over it for every loop
    "change": ["max p", "top-1 flip from the loop before", "log(1 + KL(p_k-1 || p_k))", "|h_k - h_k-1| / |h_k|",
               "loop 1 (no loop before)"],
    "state": ["normed state", "max p", "entropy / log V", "log(1 + KL(p_k-1 || p_k))"],
}


class ExitGate(nn.Module):
    """The learned exit: the chance that exiting after this loop keeps the output, sigmoid(w . features + b), one gate
    for every loop. 'change' (issue 67): how the loop changed what it decodes and its state (6 parameters): a rule of
    settling, learned, which a token's surface cannot drive. 'state' (issue 62): the normed loop state as the head reads
    it and three summaries of p (n_embd + 4 parameters); on hops it learned what an answer looks like, and sent OOD
    answers out at loop 1 (RESULTS.md, "Exits that pay")."""

    def __init__(self, n_embd, features="change"):
        super().__init__()  # `features` is checked where it is read: exits.py's --gate_features, load_gate's file
        self.kind = features
        self.w = nn.Linear(n_embd + 3 if features == "state" else len(GATE_FEATURES["change"]), 1)

    @staticmethod
    def features(kind, model, h, p, before):
        """(..., n) float32 inputs of a `kind` gate from a loop's state h, its decoded p (model.decode) and the loop
        before's (p, h), or None at loop 1 (flip, KL and change 0)."""
        p = p.float()
        logp = p.clamp_min(1e-30).log()
        zero = torch.zeros_like(logp[..., 0])
        kl, flip, moved = zero, zero, zero
        if before is not None:
            q, h0 = before[0].float(), before[1]
            kl = (q * (q.clamp_min(1e-30).log() - logp)).sum(-1).clamp_min(0)
            flip = (p.argmax(-1) != q.argmax(-1)).float()
            moved = (h - h0).float().norm(dim=-1) / h.float().norm(dim=-1).clamp_min(1e-12)
        if kind == "change":
            return torch.stack([p.amax(-1), flip, kl.log1p(), moved, zero + (before is None)], -1)
        ent = -(p * logp).sum(-1) / math.log(p.size(-1))
        return torch.cat([model.normed(h).float(), torch.stack([p.amax(-1), ent, kl.log1p()], -1)], -1)

    def forward(self, x):
        """Logits (...,) of the chance, from features()."""
        return self.w(x).squeeze(-1)

    def score(self, model):
        """model.Exit's score: (h, p, (p, h) of the loop before or None) -> (B, T) chance in 0..1."""
        return lambda h, p, before: torch.sigmoid(self(self.features(self.kind, model, h, p, before)))

    def load_record(self, sd):
        """Load a gate's weights; issue 62's files (two layers: 'state' on the normed state, 'dist' on p's summaries) are
        the one layer over their concatenation. Weights of another shape, complex or not finite: a ValueError naming
        which (a NaN gate would load, and silently never exit)."""
        old = ("state.weight", "state.bias", "dist.weight")
        if isinstance(sd, dict) and "state.weight" in sd:
            if not all(torch.is_tensor(sd.get(k)) and sd[k].dim() for k in old):
                raise ValueError(f"issue 62's two layers need {', '.join(old)} as tensors")
            sd = {"w.weight": torch.cat([sd["state.weight"], sd["dist.weight"].view(1, -1)], 1), "w.bias": sd["state.bias"]}
        want = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        if not isinstance(sd, dict) or set(sd) != set(want) or not all(torch.is_tensor(v) for v in sd.values()):
            raise ValueError(f"weights {sorted(sd) if isinstance(sd, dict) else type(sd).__name__}, expected tensors "
                             f"{sorted(want)}")
        bad = [f"{k} of shape {tuple(v.shape)}, expected {want[k]}" for k, v in sd.items() if tuple(v.shape) != want[k]]
        bad += [f"{k} is {v.dtype}, not real numbers" for k, v in sd.items() if v.is_complex() or v.dtype == torch.bool]
        bad = bad or [f"{k} is not finite" for k, v in sd.items() if not torch.isfinite(v.double()).all()]
        if bad:
            raise ValueError(bad[0])
        self.load_state_dict(sd)


def weights_crc(model):
    """The identity of the weights a model computes with (its weight average or raw weights, as built): content CRC-32."""
    return content_crc(model.state_dict())


def checkpoint_file(ckpt):
    """The checkpoint file a run folder or checkpoint path names (a folder: its ckpt.pt)."""
    return os.path.join(ckpt, "ckpt.pt") if os.path.isdir(ckpt) else ckpt


def gate_path(ckpt):
    """Where the exit gate of a checkpoint lives: beside it, named after it, one gate file per checkpoint file. X.pt's
    is X.exit_gate.pt (as round 7 named it, so its gates still open); any other name keeps its whole name, F.gate.pt
    (ckpt.bak: ckpt.bak.gate.pt, a.pth: a.pth.gate.pt). The two forms never meet (before 'gate.pt' one has '_', the
    other '.'), and each is one-to-one: no two checkpoint files share a gate file (test_exits)."""
    f = checkpoint_file(ckpt)
    return f[:-3] + GATE_SUFFIX if f.endswith(".pt") else f + OTHER_GATE_SUFFIX


def load_gate(ckpt, model):
    """(ExitGate, its record) trained beside checkpoint `ckpt` for this very model (the same weights and model_args): a
    missing, foreign, damaged or other model's gate is one CheckpointError line. An earlier commit's exit_gate.pt
    beside ckpt.pt (compat.OLD_GATE_FILE) opens when ckpt.pt has no gate of today's name."""
    if not ckpt:
        raise ConfigError("exit_rule='gate' reads the gate trained beside a checkpoint (python exits.py gate --ckpt=RUN): "
                          "this model has no checkpoint: allowed 'prob' or 'kl'")
    path, train = gate_path(ckpt), f"python exits.py gate --ckpt={ckpt}"
    old = os.path.join(os.path.dirname(path), OLD_GATE_FILE)
    if not os.path.lexists(path) and os.path.basename(checkpoint_file(ckpt)) == "ckpt.pt" and os.path.lexists(old):
        path = old
    is_ = not_regular(path)  # a named pipe would block torch.load for ever
    if is_ or not os.path.isfile(path):
        raise CheckpointError(f"exit_rule='gate' needs the exit gate beside the checkpoint: '{path}' "
                              f"{'is ' + is_ if is_ else 'not found'} (train it: {train})")
    try:
        rec = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a foreign or damaged file: one line, never a traceback
        raise CheckpointError(f"'{path}' is not a readable exit gate ({type(e).__name__})") from None
    if not isinstance(rec, dict) or rec.get(MARK) != "exit gate":
        raise CheckpointError(f"'{path}' is not an exit gate ({MARK!r} 'exit gate' missing): train one with {train}")
    lacks = [k for k in GATE_KEYS if k not in rec] or ([] if isinstance(rec["model_args"], dict) else ["model_args"])
    if lacks:
        raise CheckpointError(f"'{path}' carries the exit gate's mark but lacks {', '.join(map(repr, lacks))} (damaged "
                              f"or hand-edited): train it again with {train}")
    wrong = next((f"{k}={rec[k]!r} (allowed {what})" for k, (ok, what) in GATE_TYPES.items() if not ok(rec[k])), None)
    if wrong:
        raise CheckpointError(f"'{path}' carries the exit gate's mark but {wrong} (damaged or hand-edited): train it "
                              f"again with {train}")
    crc, args = weights_crc(model), dataclasses.asdict(model.config)
    why = next((f"{k}: the gate's model has {v!r}, this one {args[k]!r}" for k, v in rec["model_args"].items()
                if k in args and args[k] != v), None)  # a key newer than the gate is not compared
    why = why or (f"weights CRC-32 {rec['crc32']:#010x}, this model's {crc:#010x}" if rec["crc32"] != crc else None)
    if why:
        raise CheckpointError(f"'{path}' is the exit gate of another model ({rec['of']}; {why}): train one for this one "
                              f"with python exits.py gate --ckpt={ckpt}")
    kind = rec.get("gate_features", "state")  # files before issue 67 read the state
    if not isinstance(kind, str) or kind not in GATE_FEATURES:
        raise CheckpointError(f"'{path}': gate_features={kind!r} is invalid: allowed {list(GATE_FEATURES)} (damaged or "
                              f"hand-edited): train it again with {train}")
    gate = ExitGate(model.config.n_embd, kind)
    try:
        gate.load_record(rec["gate"])
    except ValueError as e:  # hand-edited or damaged weights: which, in one line
        read = "" if "gate_features" in rec else "; it names no gate_features, so it was read as issue 62's 'state' gate"
        raise CheckpointError(f"'{path}' holds a {kind!r} exit gate whose weights do not load ({e}{read}): train it "
                              f"again with {train}") from None
    return gate.to(next(model.parameters()).device).eval(), rec
