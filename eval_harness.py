"""
Zero-shot evaluation of a pretrained checkpoint with lm-evaluation-harness (paper Table 2).

    python eval_harness.py --ckpt=out/pretrain_disco --tasks=arc_challenge,arc_easy,hellaswag,lambada_openai,piqa,race,sciq
    python eval_harness.py --ckpt=out/pretrain_disco --tasks=piqa --limit=100 --n_loop=6      # more loops than trained
    python eval_harness.py lm_eval --model discoloop --model_args ckpt=out/pretrain_disco --tasks piqa   # the harness CLI
    python eval_harness.py --ckpt=out/small_disco --tasks=table2_offline --include_path=data/benchmarks/out  # offline
    python eval_harness.py --ckpt=out/small_disco --tasks=piqa --exit_rule=prob --exit_threshold=0.5   # adaptive depth
    python eval_harness.py --ckpt=out/small_disco --tasks=lambada_openai --speculative_draft_loops=1   # speculative greedy
    python eval_harness.py --backend=vllm --ckpt=out/hf_small_disco --tasks=piqa   # an export in vLLM (serving extra)

Prints Table 2's row (acc_norm where the harness reports it, else acc, and the average) and
writes JSON (with exit_rule: the mean loops per scored token, model.Exit). The model is registered with the harness as "discoloop"; the harness's own CLI does not
import third-party modules, so `python eval_harness.py lm_eval ...` runs it with this one registered.
The tokenizer is the one the checkpoint records (a Hugging Face folder, read by pretrained.py: its tokenizer.json);
one with ids past the model's rows is refused. --backend=vllm evaluates an export_hf.py folder in vLLM (VllmLM: the
same requests, tokens and scoring, every sequence submitted at once to the engine's continuous batching).
"""
import inspect
import json
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from discoloop.common import autocast, resolve_device, table
from discoloop import from_checkpoint
from discoloop.checkpoint import load_checkpoint
from discoloop.from_checkpoint import (EXIT_CHECKS, EXIT_KEYS, KV_CHECKS, KV_KEYS, beside_checkpoint, checkpoint_tokenizer,
                                      exit_option, folder_tokenizer, kv_override, model_from_checkpoint,
                                      trained_on_tokens)
from model import Exit
from discoloop.common import ERRORS, SYSTEM_CHECKS, CheckpointError, ConfigError, atomic_write, check_writable, die
from discoloop.ownership import marked, target
from discoloop.folder_owner import hf_folder
from configurator import INT_GE0, INT_GE1, OUTPUT, configure
from discoloop.precision import resolve_dtype
from discoloop.pretrained import from_pretrained, pretrained_architecture
from discoloop import speculative
from discoloop.speculative import SPEC_CHECKS, SPEC_KEYS, spec_option

TABLE2 = ["arc_challenge", "arc_easy", "hellaswag", "lambada_openai", "piqa", "race", "sciq"]


def encoding_for(ckpt):
    """The tiktoken Encoding the checkpoint's shards were made with (data/pretrain/prepare.py)."""
    if not trained_on_tokens(ckpt):
        raise CheckpointError("checkpoint was trained on question-answer data (a word vocabulary), not on token "
                              "shards: eval_harness.py evaluates pretraining checkpoints (probe.py the others)")
    if "tokenizer" not in ckpt and "encoding" not in ckpt.get("data_config", {}):
        raise CheckpointError("checkpoint records no tokenizer (and its data config no encoding): its tokens cannot "
                              "be read back")
    return checkpoint_tokenizer(ckpt)


def folder_tokenizer_first(path):
    """The tokenizer of a Hugging Face folder (pretrained.py), read before its weights: a folder without a usable
    one, or with more tokens than the model has rows, is one line before anything heavy."""
    return folder_tokenizer(path, pretrained_architecture(path)[1]["vocab_size"])


def open_model(ckpt, n_loop=None, exit_rule="", exit_threshold=-1, exit_min_loops=1, speculative_draft_loops=0,
               speculative_len=4, speculative_propose=0, speculative_recheck=0, kv_share="checkpoint"):
    """(tokenizer, model, n_loop or None, exits, speculative options) of a checkpoint (or a Hugging Face folder), every
    option checked against the model: what DiscoLoopLM evaluates, opened once (check_model_args: before the harness
    CLI's log lines)."""
    if hf_folder(ckpt):  # e.g. the pretrained model a looped one was continued from (data/smollm2/out)
        enc = folder_tokenizer_first(ckpt)
        model = from_pretrained(ckpt, **kv_override(kv_share))
    else:
        ck = load_checkpoint(ckpt) if isinstance(ckpt, str) else ckpt
        enc = encoding_for(ck)  # before the model is built: a question-answer checkpoint is one line
        model = model_from_checkpoint(ck, **kv_override(kv_share))
    model.eval()
    n_loop = int(n_loop) if n_loop not in (None, "", 0, "0") else None
    K = model.config.n_loop
    if n_loop is not None and (n_loop < 1 or (model.rec.copies and n_loop > K)):
        raise ConfigError(f"n_loop={n_loop} is invalid: allowed 0 (the trained K={K}) or 1.."
                          f"{K if model.rec.copies else 'any'} for recurrence={model.config.recurrence!r}")
    exits = exit_option(exit_rule, exit_threshold, exit_min_loops, model, n_loop,
                        ckpt if isinstance(ckpt, str) else None)  # 'gate': the gate beside the checkpoint
    spec = spec_option(int(speculative_draft_loops), int(speculative_len), model, n_loop, exits,
                       propose=int(speculative_propose), recheck=int(speculative_recheck))
    return enc, model, n_loop, exits, spec


@register_model("discoloop")
class DiscoLoopLM(TemplateLM):
    def __init__(self, ckpt, n_loop=None, batch_size=16, device="auto", dtype="auto", max_gen_toks=256, exit_rule="",
                 exit_threshold=-1, exit_min_loops=1, speculative_draft_loops=0, speculative_len=4,
                 speculative_propose=0, speculative_recheck=0, kv_share="checkpoint", **_):
        super().__init__()
        self.dev = resolve_device(device)
        opts = dict(n_loop=n_loop, exit_rule=exit_rule, exit_threshold=exit_threshold, exit_min_loops=exit_min_loops,
                    speculative_draft_loops=speculative_draft_loops, speculative_len=speculative_len,
                    speculative_propose=speculative_propose, speculative_recheck=speculative_recheck,
                    kv_share=kv_share)
        held = CHECKED.pop(ckpt, None) if isinstance(ckpt, str) else None  # opened by check_model_args with these
        self.enc, model, self.n_loop, self.exits, self.spec = (
            held[1] if held and held[0] == opts else open_model(ckpt, **opts))
        self.model = model.to(self.dev).eval()
        self.loops = [0, 0]  # adaptive depth: loops run by the scored inputs' tokens, and how many tokens
        self.generated = 0  # generate_until requests: the speculative keys act on these alone
        MADE.append(self)
        self.batch = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.ctx = autocast(self.dev, resolve_dtype(dtype, self.dev))
        self.max_length = self.model.config.block_size

    @property
    def eot_token_id(self):
        return self.enc.eot_token

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.enc.encode_ordinary(string)

    def tok_decode(self, tokens, **kwargs):
        return self.enc.decode(tokens)

    def _encode_pair(self, context, continuation):
        ctx, cont = super()._encode_pair(context, continuation)
        if not cont:  # a BPE token spanned the context/continuation boundary: encode them apart
            n = len(context) - len(context.rstrip())
            ctx, cont = self.tok_encode(context[:len(context) - n]), self.tok_encode(context[len(context) - n:] + continuation)
        return ctx, cont

    @torch.no_grad()
    def _logprobs(self, rows):
        """rows: list of (input ids, n scored) -> per row (log-probs of the last n targets, all greedy).
        Each row's input is its tokens minus the last; one padded forward per batch, and the head
        runs only at the scored positions (no (B, T, V) logits)."""
        T = max(len(r) - 1 for r, _ in rows)
        x = torch.zeros(len(rows), T, dtype=torch.long)
        for i, (r, _) in enumerate(rows):
            x[i, :len(r) - 1] = torch.tensor(r[:-1])  # right padding: causal attention never sees it
        b = torch.cat([torch.full((n,), i) for i, (_, n) in enumerate(rows)])           # row of each scored position
        t = torch.cat([torch.arange(len(r) - 1 - n, len(r) - 1) for r, n in rows])      # its position
        with self.ctx:
            if self.model.config.kv_share == "latest":  # as generation reads it: a position a call through the cache
                h = self.model.hidden_stepwise(x.to(self.dev), n_loop=self.n_loop)
            else:
                h = self.model.hidden(x.to(self.dev), n_loop=self.n_loop, exits=self.exits)  # (B, T, d)
            logits = self.model.head(h[b.to(self.dev), t.to(self.dev)])  # (scored, V)
        logp = F.log_softmax(logits.float(), dim=-1).cpu()
        if self.exits is not None:  # the real positions of each row (right padding is not the model's work)
            real = torch.arange(T)[None] < torch.tensor([len(r) - 1 for r, _ in rows])[:, None]
            at = self.exits.loops.pop().cpu()
            self.loops = [self.loops[0] + int(at[real].sum()), self.loops[1] + int(real.sum())]
        out, s = [], 0
        for r, n in rows:
            tgt = torch.tensor(r[-n:])
            lp = logp[s:s + n]
            s += n
            out.append((lp.gather(1, tgt[:, None]).sum().item(), bool((lp.argmax(-1) == tgt).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        # longest first: batches of similar length, and an OOM shows up on the first batch
        rows = []
        for _, ctx, cont in requests:
            whole = (ctx + cont)[-(self.max_length + 1):]  # keep the end; a too-long continuation loses its start
            rows.append((whole, min(len(cont), len(whole) - 1)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results = [None] * len(rows)
        for s in tqdm(range(0, len(order), self.batch), disable=disable_tqdm, desc="loglikelihood"):
            idx = order[s:s + self.batch]
            for i, r in zip(idx, self._logprobs([rows[i] for i in idx])):
                results[i] = r
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            tokens = self.tok_encode(req.args[0])
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                tokens, prefix_token=self.eot_token_id, max_seq_len=self.max_length, context_len=1)]
            total = 0.0
            for s in range(0, len(windows), self.batch):
                rows = [(ctx + pred, len(pred)) for ctx, pred in windows[s:s + self.batch]]
                total += sum(lp for lp, _ in self._logprobs(rows))
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
            self.generated += 1
            context, kw = req.args
            until = kw.get("until", [self.tok_decode([self.eot_token_id])])
            until = [until] if isinstance(until, str) else until
            max_new = int(kw.get("max_gen_toks", self.max_gen_toks))
            max_new = min(max_new, self.max_length - 1)
            # greedy through GPT.generate's (loop, layer) cache; a context too long for the window keeps its last
            # max_length - max_new tokens (as the harness's own HF model does)
            ids = (self.tok_encode(context) or [self.eot_token_id])[-(self.max_length - max_new):]

            def stop(y, n=len(ids)):
                new = y[0, n:].tolist()
                return new[-1] == self.eot_token_id or any(u in self.tok_decode(new) for u in until)
            with self.ctx:
                x, kw = torch.tensor([ids], device=self.dev), dict(n_loop=self.n_loop, n_vocab=self.enc.n_vocab, stop=stop)
                y = (speculative.generate(self.model, x, max_new, self.spec, temperature=0, **kw) if self.spec else
                     self.model.generate(x, max_new, temperature=0, exits=self.exits, **kw))
            if self.exits is not None:  # the mean depth counts the scored inputs (loglikelihood) only
                self.exits.loops.clear()
            new = y[0, len(ids):].tolist()
            new = new[:-1] if new and new[-1] == self.eot_token_id else new
            text = self.tok_decode(new)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


class VllmLM(DiscoLoopLM):
    """DiscoLoopLM's requests, tokens and scoring on an export_hf.py folder run by vLLM (engine.start): every row's
    log-probs from the engine's prompt log-probs (greedy = each target ranked first), every generation greedy with
    the same stop rule applied to the tokens it returns, all submitted at once (continuous batching). The engine runs
    every loop: main() refuses exit and speculative keys in one line first (engine.refuse_keys)."""

    def __init__(self, ckpt, n_loop=None, dtype="auto", max_gen_toks=256, kv_share="checkpoint", **_):
        from discoloop import engine  # here: only the vLLM backend reads an export for the engine
        TemplateLM.__init__(self)
        n_loop = int(n_loop) if n_loop not in (None, "", 0, "0") else None
        share = kv_override(kv_share).get("kv_share")
        cfg, self.n_loop = engine.check_export(ckpt, n_loop, kv_share=share)
        self.enc = folder_tokenizer(ckpt, cfg.vocab_size)
        self.llm = engine.start(ckpt, n_loop, dtype="float32" if dtype == "auto" else dtype, skip_tokenizer_init=True,
                                max_logprobs=1, kv_share=share)
        self.exits = self.spec = None
        self.loops, self.generated, self.batch = [0, 0], 0, 1 << 30  # one engine call takes every request
        self.max_gen_toks, self.max_length = int(max_gen_toks), cfg.block_size
        MADE.append(self)

    @staticmethod
    def check(c):
        """What the engine cannot run (exit and speculative keys, an export it refuses): one line, before any work."""
        from discoloop import engine  # here: only the vLLM backend reads an export for the engine
        engine.refuse_keys({k: c[k] for k in (*EXIT_KEYS, *SPEC_KEYS)})
        engine.check_export(c["ckpt"], c["n_loop"] or None, kv_share=kv_override(c["kv_share"]).get("kv_share"))

    def _logprobs(self, rows):
        from vllm import SamplingParams
        outs = self.llm.generate([{"prompt_token_ids": list(r)} for r, _ in rows],
                                 SamplingParams(max_tokens=1, prompt_logprobs=1, detokenize=False), use_tqdm=False)
        res = []
        for (r, n), o in zip(rows, outs):
            scored = [(o.prompt_logprobs[t][r[t]]) for t in range(len(r) - n, len(r))]
            res.append((sum(lp.logprob for lp in scored), all(lp.rank == 1 for lp in scored)))
        return res

    def generate_until(self, requests, disable_tqdm=False):
        from vllm import SamplingParams
        asks = []
        for req in requests:
            context, kw = req.args
            until = kw.get("until", [self.tok_decode([self.eot_token_id])])
            max_new = min(int(kw.get("max_gen_toks", self.max_gen_toks)), self.max_length - 1)
            ids = (self.tok_encode(context) or [self.eot_token_id])[-(self.max_length - max_new):]
            asks.append(([until] if isinstance(until, str) else until, ids, max_new))
        outs = self.llm.generate([{"prompt_token_ids": ids} for _, ids, _ in asks],
                                 [SamplingParams(temperature=0, max_tokens=m, stop_token_ids=[self.eot_token_id],
                                                 detokenize=False) for _, _, m in asks], use_tqdm=not disable_tqdm)
        texts = []
        for (until, _, _), o in zip(asks, outs):  # DiscoLoopLM's rule on the tokens: end of text, then `until`
            new = list(o.outputs[0].token_ids)
            text = self.tok_decode(new[:-1] if new and new[-1] == self.eot_token_id else new)
            for u in until:
                text = text.split(u)[0]
            texts.append(text)
        self.generated += len(requests)
        return texts


def table2_row(results, tasks):
    """{task: score}: acc_norm where the harness reports it, else acc (the paper's choice). A tag or group
    (table2_offline) stands for its tasks; data/benchmarks' local copies keep their `_local` names."""
    row = {}
    for t in [t for t in tasks if t in results] + sorted(t for t in results if t not in tasks):
        r = results[t]
        key = "acc_norm,none" if "acc_norm,none" in r else "acc,none"
        if key in r:
            row[t] = 100 * r[key]
    if row:
        row["avg"] = sum(row.values()) / len(row)
    return row


BACKENDS = ("discoloop", "vllm")
DEFAULTS = dict(
    ckpt="",                  # checkpoint file or run folder, or a Hugging Face model folder (required); vllm: an export
    backend="discoloop",      # 'discoloop' (model.py in this process) or 'vllm' (an export_hf.py folder in vLLM)
    tasks=",".join(TABLE2),   # comma list of lm-eval tasks (default: the paper's Table 2)
    n_loop=0,                 # loops at evaluation (0 = the trained K)
    batch_size=16,            # sequences per forward
    limit=0,                  # examples per task (0 = all)
    device="auto",            # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="auto",             # 'auto' | 'float32' | 'bfloat16'
    include_path="",          # folder of extra task YAMLs (local tasks; data/benchmarks/prepare.py writes Table 2's)
    threads=0,                # CPU threads (0 = torch default)
    json="",                  # output JSON (default: eval_harness.json in the run folder)
    **KV_KEYS,
    **EXIT_KEYS,
    **SPEC_KEYS,
)
CHECKS = {**SYSTEM_CHECKS, "batch_size": INT_GE1, "backend": (lambda v: v in BACKENDS, f"one of {BACKENDS}"), "limit": INT_GE0, "json": OUTPUT, "n_loop": INT_GE0,
          "tasks": (lambda v: all(t.strip() for t in v.split(",")), "a comma list of lm-eval task names"),
          "include_path": (lambda v: v == "" or os.path.isdir(v), "'' or an existing folder of task YAMLs"), **EXIT_CHECKS,
          **KV_CHECKS,
          **SPEC_CHECKS}
CHECKED = {}  # {ckpt path: checkpoint} read by check_model_args, so that the harness's model does not read it again
MADE = []  # the models the harness CLI built: what their speculative keys did is said after it ends
MODEL_ARG_INTS = {"n_loop": 0, "batch_size": 1, "max_gen_toks": 1, "exit_min_loops": 1,  # integer arguments, minimum
                  "speculative_draft_loops": 0, "speculative_len": 1, "speculative_propose": 0,
                  "speculative_recheck": 0}


def check_model_args(args):
    """The harness CLI logs its setup before it builds our model, so a bad checkpoint or value would be an error after
    lines of its own: "discoloop"'s --model_args are checked here first (the checkpoint read once, kept for the model)."""
    opts = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}
    opts.update({a: b for a, b in zip(args, args[1:]) if a.startswith("--") and "=" not in a})
    if opts.get("--model") != "discoloop":
        return
    kv = dict(p.split("=", 1) for p in opts.get("--model_args", "").split(",") if "=" in p)
    if not kv.get("ckpt"):
        raise ConfigError("--model discoloop needs --model_args ckpt=PATH (a pretraining checkpoint file or run folder)")
    for key, lo in MODEL_ARG_INTS.items():
        if key in kv and not (kv[key].isdigit() and int(kv[key]) >= lo):
            raise ConfigError(f"--model_args {key}={kv[key]!r} is invalid: allowed an integer >= {lo}")
    if kv.get("exit_rule"):  # rule and threshold (model.Exit's one check; 'gate' is read with the model: a stand-in)
        try:
            threshold = float(kv.get("exit_threshold", -1))
            Exit(kv["exit_rule"], 0.9 if threshold == -1 else threshold, score=lambda *_: None)
        except ValueError as e:
            raise ConfigError(f"--model_args exit_rule={kv['exit_rule']!r}, exit_threshold="
                              f"{kv.get('exit_threshold', -1)!r}: {e}") from None
    if "dtype" in kv and not SYSTEM_CHECKS["dtype"][0](kv["dtype"]):
        raise ConfigError(f"--model_args dtype={kv['dtype']!r} is invalid: allowed {SYSTEM_CHECKS['dtype'][1]}")
    from lm_eval.utils import simple_parse_args_string  # the harness's own reading of --model_args
    parsed = simple_parse_args_string(opts.get("--model_args", ""))
    allowed = set(inspect.signature(DiscoLoopLM.__init__).parameters) - {"self", "_"}
    unknown = sorted(set(parsed) - allowed)
    if unknown:  # DiscoLoopLM takes **_ (the harness's own batch_size, device, ...): a typo would be ignored
        raise ConfigError(f"--model_args {unknown[0]}={parsed[unknown[0]]!r} is not a key of the discoloop model: allowed "
                          f"{', '.join(sorted(allowed))}")
    keys = {k: p.default for k, p in inspect.signature(open_model).parameters.items() if k != "ckpt"}
    o = {k: parsed.get(k, v) for k, v in keys.items()}
    CHECKED[kv["ckpt"]] = (o, open_model(kv["ckpt"], **o))  # every option against the model, then kept for the harness
    named = opts.get("--tasks") or next((b for a, b in zip(args, args[1:]) if a == "-t"), "")  # the harness's -t too
    if int(o["speculative_draft_loops"]) or int(o["speculative_propose"]):  # as the script's --tasks (task_names)
        from lm_eval.tasks import TaskManager
        tm, tasks = TaskManager(include_path=opts.get("--include_path")), named.split(",")
        check_speculative_tasks(True, {**o, "tasks": named},
                                declared_output_types(tm, tasks) if all(t in tm.all_tasks for t in tasks) else None)


def leaf_tasks(loaded):
    """The tasks of get_task_dict's answer, groups (nested dicts) opened."""
    for v in loaded.values():
        yield from leaf_tasks(v) if isinstance(v, dict) else [v]


def declared_output_types(tm, tasks):
    """{output_type} the tasks' YAML files declare (includes followed, nothing loaded), or None where one cannot be
    told so (a group, a tag, a Python task, another harness version): then the loaded tasks say it."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml
        kinds = set()
        for t in tasks:
            entry = tm.task_index[t]
            path = entry.get("yaml_path") if isinstance(entry, dict) else getattr(entry, "yaml_path", None)
            kind = load_yaml(path, resolve_func=False).get("output_type") if path else None
            if kind is None or str(getattr(entry, "kind", "task")).lower().split(".")[-1] not in ("task",):
                return None
            kinds.add(kind)
        return kinds
    except Exception:  # noqa: BLE001 (the harness's internals: the check after loading still holds)
        return None


def check_speculative_tasks(spec_on, c, kinds):
    """speculative_* keys act on generated text alone (generate_until): on tasks that only score (loglikelihood,
    multiple choice) they would change nothing, so they are refused (the inert-key rule) before the evaluation.
    kinds: the tasks' output types (None: not known yet)."""
    if not spec_on or kinds is None:
        return
    if "generate_until" not in kinds:
        typed = ", ".join(f"{k}={c[k]}" for k in SPEC_KEYS if c[k] != DEFAULTS[k])
        raise ConfigError(f"{typed} has no effect: task(s) {c['tasks'].split(',')} only score text "
                          f"({', '.join(sorted(str(k) for k in kinds))}), and speculative decoding acts on generated text "
                          "(generate_until tasks): allowed on a task that generates, or drop the speculative_* keys")


def task_names(c, tm):
    """(tm, the task names of --tasks), each known to the harness and fit for the speculative keys, before the model
    and the tasks' data."""
    tasks = c["tasks"].split(",")
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise ConfigError(f"unknown task(s) {unknown}; see `lm_eval --tasks list` or pass --include_path")
    check_speculative_tasks(c["speculative_draft_loops"] or c["speculative_propose"], c, declared_output_types(tm, tasks))
    return tm, tasks


def passthrough_args(args):
    """The harness CLI's arguments for our model: its --device defaults to CUDA, so a machine without one gets
    --device=cpu unless asked otherwise, and a device= inside --model_args becomes --device (the harness
    would pass the keyword twice)."""
    args = list(args)
    for i, a in enumerate(args[:-1]):
        if a == "--model_args" and "device=" in args[i + 1]:
            kept = [kv for kv in args[i + 1].split(",") if not kv.startswith("device=")]
            dev = [kv.split("=", 1)[1] for kv in args[i + 1].split(",") if kv.startswith("device=")][-1]
            args[i + 1] = ",".join(kept)
            if "--device" not in args:
                args += ["--device", dev]
    if "--device" not in args and not torch.cuda.is_available():
        args += ["--device", "cpu"]
    return args


def note_idle_speculation():
    """Tasks named by a tag or group cannot be told apart before they load (check_model_args): a model of the
    harness CLI whose speculative keys met no generate_until request says so when the evaluation ends."""
    for lm in MADE:
        if lm.spec is not None and not lm.generated:
            print(f"note: {lm.spec.name()} had no effect: the tasks only scored text (no generate_until request); "
                  "drop the speculative_* keys for them", file=sys.stderr)


def make_lm(c):
    """The harness's model for the script's keys: VllmLM on an export, or DiscoLoopLM."""
    if c["backend"] == "vllm":
        return VllmLM(c["ckpt"], n_loop=c["n_loop"], dtype=c["dtype"], kv_share=c["kv_share"])
    return DiscoLoopLM(c["ckpt"], n_loop=c["n_loop"], batch_size=c["batch_size"], device=c["device"], dtype=c["dtype"],
                       **{k: c[k] for k in (*EXIT_KEYS, *SPEC_KEYS, *KV_KEYS)})


def main(argv):
    if argv and argv[0] == "lm_eval":  # the harness CLI, with "discoloop" registered
        from lm_eval.__main__ import cli_evaluate
        try:
            check_model_args(argv[1:])
            sys.argv = ["lm_eval"] + passthrough_args(argv[1:])
            out = cli_evaluate()
            note_idle_speculation()
            return out
        except (*ERRORS, ValueError) as e:  # our model's one-line errors (bad device, checkpoint, ...)
            die(e)
    try:
        c = configure(DEFAULTS, argv, __doc__, [__file__, from_checkpoint.__file__, speculative.__file__], CHECKS)  # keys' comments
        if not c["ckpt"]:
            raise ConfigError("--ckpt=PATH is required (a checkpoint file or run folder)")
        if c["backend"] == "vllm":  # what the engine cannot run, before anything else is said or done
            VllmLM.check(c)
        path = target(c["json"] or beside_checkpoint(c["ckpt"], "eval_harness.json"), "eval_harness.py", "json")
        check_writable(path, "pass --json=PATH somewhere writable")
        import lm_eval
        from lm_eval.tasks import TaskManager
        if c["threads"]:
            torch.set_num_threads(c["threads"])
        tm, tasks = task_names(c, TaskManager(include_path=c["include_path"] or None))
        lm = make_lm(c)
        try:  # the task data: from the hub's cache, or local files (--include_path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                loaded = lm_eval.tasks.get_task_dict(tasks, tm)
        except Exception as e:
            name, why = type(e).__name__, (str(e).strip().splitlines() or [""])[0][:160]
            if isinstance(e, OSError) or any(w in name for w in ("Connection", "Offline", "Hub", "NotFound")):
                raise ConfigError(f"the data of task(s) {tasks} could not be loaded ({name}; offline?): it must be "
                                  "in the local Hugging Face cache (run once with network, then HF_DATASETS_OFFLINE=1), "
                                  "or pass local task YAMLs with --include_path") from None
            raise ConfigError(f"the data of task(s) {tasks} could not be loaded ({name}: {why}): an empty or "
                              "malformed data file?") from None
        empty = [t for t, task in loaded.items() if hasattr(task, "eval_docs") and len(task.eval_docs) == 0]
        if empty:  # the harness would fail far from the cause (a division by zero in its metrics)
            raise ConfigError(f"task(s) {empty} have no examples to evaluate (an empty data file?)")
        check_speculative_tasks(lm.spec is not None, c, {getattr(t, "OUTPUT_TYPE", None) or getattr(
            getattr(t, "config", None), "output_type", None) for t in leaf_tasks(loaded)})  # what the YAMLs did not tell
        res = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, num_fewshot=0, limit=c["limit"] or None)
    except (*ERRORS, ValueError) as e:
        die(e)
    row = table2_row(res["results"], tasks)
    print(table(list(row), [[f"{v:.1f}" for v in row.values()]]))
    depth = lm.loops[0] / max(lm.loops[1], 1) if lm.exits is not None else None
    if depth is not None:
        print(f"adaptive depth ({c['exit_rule']} {lm.exits.threshold:g}, min {c['exit_min_loops']}): {depth:.3f} loops per "
              f"token of {lm.n_loop or lm.model.config.n_loop}, over {lm.loops[1]} tokens of the scored inputs")
    if lm.spec is not None and lm.spec.loops_per_token(1):  # only generate_until's tasks generate
        print(lm.spec.summary())
    result = {"row": row, "results": res["results"], "n_loop": c["n_loop"] or None, "mean_loops": depth,
              "exit": {**{k: c[k] for k in EXIT_KEYS}, "exit_threshold": lm.exits.threshold if lm.exits else -1}}
    try:
        atomic_write(path, json.dumps(marked(result, "eval_harness.py"), indent=1, default=str))
    except OSError as e:
        die(f"could not write '{path}' ({e.strerror}): pass --json=PATH somewhere writable")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
