"""
train.py's keys: each key's default and meaning (--help prints the comment on its line), its one check,
and when it acts (ACTIVE). The checks that need the opened dataset live beside it (dataset.check_with_data). Model keys are GPTConfig's (model.py), checked there.
Importable without running training, so bench.py plans and times a training config with the same keys.
"""

import torch

from discoloop.common import SYSTEM_CHECKS, ConfigError
from configurator import FOLDER, INT_GE0, INT_GE1, OUTPUT, check_inert, num, one_of
from discoloop import curriculum
from model import RECURRENCES, GPTConfig

_imported = set(globals())  # every name above is not a key
# -----------------------------------------------------------------------------
# I/O
out_dir = "out/symbolic"     # run folder: ckpt.pt, metrics.jsonl, config.json
eval_interval = 390          # iterations between evaluations and checkpoints (10 epochs)
log_interval = 10            # iterations between reading the loss back (the only host sync of a step)
keep_every = 0               # > 0: also keep ckpt_<iteration>.pt every this many iterations (a multiple of eval_interval), to probe a run at several epochs
eval_only = False            # evaluate the checkpoint in out_dir once and exit
init_from = "scratch"        # 'scratch', 'resume' (from out_dir/ckpt.pt), or a folder whose weights start a new run with this config's optimizer and schedule: a run folder / checkpoint (a branch), or a Hugging Face model folder (pretrained.py: it decides the architecture)
overwrite = False            # with init_from='scratch': replace the checkpoint and metrics already in out_dir
wandb_log = False            # also log metrics to wandb
wandb_project = "discoloop"  # wandb project name
wandb_run_name = "run"       # wandb run name
# data
dataset = "symbolic"         # the generator, data/<dataset>/prepare.py: 'symbolic' | 'nl' | 'pretrain'
data_dir = "data/symbolic/out"  # prepared dataset folder (generated on first use for symbolic/nl)
data_args = {}               # arguments of data/<dataset>/prepare.py's prepare(), e.g. {"eval_hops": 4}
batch_size = 512             # per process and micro-step
gradient_accumulation_steps = 1  # total over all processes, as in nanoGPT
eval_batch_size = 2048       # QA: questions per evaluation forward
eval_iters = 50              # pretrain: validation batches per evaluation
stage1_splits = "train"      # QA: splits (name prefixes, comma list, or 'all') whose Stage-1 accuracy each evaluation reports; splits a stop or join rule reads as acc1/ are added
stop_metric = ""             # '' = off; else stop early on this evaluation metric, e.g. 'loss/val_id' (loss: lower is better, acc: higher); never a test split
stop_patience = 10           # with stop_metric: stop after this many evaluations without a new best
loops_by_hops = False        # QA: a k-hop question is trained and evaluated after k loops (atomic facts after 1): one hop per loop, for hop extrapolation
extra_loops = 0              # with loops_by_hops: each training question gets 0..extra_loops more loops (drawn per row), so its answer must survive them
loop_sample = 0.0            # > 0: this fraction of training steps (drawn per step from seed and iteration, so a resume draws the same) runs only 1..K-1 loops, uniformly drawn, and reads the head there (Huginn's sampled depth: early loops worth reading)
split_join = {}              # QA curriculum: {training split: iteration it joins the mix, or a rule on a validation metric}, e.g. {"train_id_3hop": 6630} or {"train_id_3hop": "acc/val_id>=0.9"}
# model: every GPTConfig field is a key here too, defined there once (model.py; --help lists them)
# optimizer: AdamW on everything, or Muon on the 2-D block matrices + AdamW on the rest
optimizer = "adamw"          # 'adamw' | 'muon'
learning_rate = 3e-3         # peak learning rate
max_iters = 17550            # 450 epochs of 39 iterations (20,000 examples / 512); config/symbolic.py stops
                             # earlier, when validation accuracy stalls (stop_metric)
weight_decay = 0.3           # matrices only
beta1 = 0.9                  # AdamW beta1 (0 <= beta1 < 1)
beta2 = 0.98                 # AdamW beta2 (0 <= beta2 < 1)
adam_eps = 1e-8              # AdamW epsilon (> 0)
grad_clip = 1.0              # 0 disables
muon_momentum = 0.95         # Muon momentum
ema_decay = 0.0              # > 0: also keep an exponential moving average of the weights; evaluation and probes use it
# learning-rate schedule: linear warmup, then cosine/linear decay to min_lr at lr_decay_iters
decay_lr = True              # False = constant learning rate, no warmup (as nanoGPT); warmup then constant: min_lr = learning_rate
lr_schedule = "cosine"       # 'cosine' | 'linear'
warmup_iters = 200           # linear warmup iterations
lr_decay_iters = 17550       # the cosine is laid out over 450 epochs
min_lr = 3e-4                # learning rate at the end of the decay
# system
device = "auto"              # 'auto' | 'cpu' | 'cuda' | 'cuda:1' | 'mps'
dtype = "auto"               # 'auto' | 'float32' | 'bfloat16' | 'float16'
compile = False              # torch.compile each block on its own (GPT.compile_blocks; a failure is reported, not silent)
compile_mode = "default"     # torch.compile's mode with compile=True: 'default' | 'reduce-overhead' (CUDA graphs, for launch-bound small models) | 'max-autotune-no-cudagraphs'
cuda_graph = False           # capture the whole training step (forward, backward, clip, AdamW, EMA) once and replay it as one CUDA graph (stepgraph.py: for launch-bound small models; one process, adamw, not float16); the loss then runs over every row, -1 targets masked (the same numbers up to rounding); off CUDA the same step runs without a graph
seed = 0                     # seed of weights, data order and dropout (>= 0)
threads = 0                  # CPU threads (0 = torch default)
peak_flops = 0.0             # per-device peak FLOP/s for MFU (0 = report TFLOP/s only; bench.py measures one)
memory_check = True          # on CUDA: print the memory plan and stop before allocating if it does not fit


KEYS = {k: v for k, v in dict(globals()).items() if k not in _imported and not k.startswith("_")}


def on_cuda(c):
    """Whether the run's device (its key, 'auto' resolved as common.resolve_device does) is CUDA."""
    return c["device"].startswith("cuda") or c["device"] == "auto" and torch.cuda.is_available()


# when a training key acts (configurator.inert; GPTConfig.ACTIVE holds the model keys'): key or family prefix ->
# (predicate over the resolved keys, what it needs)
ACTIVE = {"compile_": (lambda c: c["compile"], "compile=True"),
          "muon_": (lambda c: c["optimizer"] == "muon", "optimizer='muon', not {optimizer!r}"),
          "wandb_": (lambda c: c["wandb_log"], "wandb_log=True"),
          "lr_": (lambda c: c["decay_lr"], "decay_lr=True (decay_lr=False is a constant learning_rate)"),
          "warmup_iters": (lambda c: c["decay_lr"], "decay_lr=True (decay_lr=False is a constant learning_rate)"),
          "min_lr": (lambda c: c["decay_lr"], "decay_lr=True (decay_lr=False is a constant learning_rate)"),
          "stop_patience": (lambda c: c["stop_metric"], "a stop_metric"),
          "eval_iters": (lambda c: c["dataset"] == "pretrain", "token shards (dataset='pretrain', not {dataset!r}: "
                         "a question-answer split is evaluated whole)"),
          "memory_check": (on_cuda,
                           "a CUDA device (the plan is checked against GPU memory), not device={device!r} here"),
          "loop_sample": (lambda c: not RECURRENCES[c["recurrence"]].copies and c["n_loop"] > 1 and not c["loops_by_hops"],
                          "a looped recurrence, not K untied copies (now {recurrence!r}), n_loop > 1 (now {n_loop}), "
                          "loops_by_hops=False"),
          "overwrite": (lambda c: c["init_from"] != "resume" and not c["eval_only"],
                        "a new run (not init_from='resume' or eval_only=True)")}


def _init_from(v):  # 'scratch', 'resume', or a folder to start from (a run folder, a Hugging Face folder)
    return isinstance(v, str) and v.strip() != ""


def _data_args(v):  # the prepare script's arguments; where it writes is data_dir's to say
    return isinstance(v, dict) and "out_dir" not in v


CHECKS = {**SYSTEM_CHECKS,
          "init_from": (_init_from, "'scratch', 'resume', or a run folder / Hugging Face folder to start from"),
          "optimizer": one_of("adamw", "muon"),
          "compile_mode": one_of("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
          "lr_schedule": one_of("cosine", "linear"),
          "learning_rate": num(0, lo_open=True),
          "min_lr": num(0),
          "weight_decay": num(0),
          "grad_clip": num(0),
          "beta1": num(0, 1, hi_open=True),
          "beta2": num(0, 1, hi_open=True),
          "adam_eps": num(0, lo_open=True),
          "ema_decay": num(0, 1, hi_open=True),
          "muon_momentum": num(0, 1, hi_open=True),
          "peak_flops": num(0),
          "stop_metric": curriculum.STOP_METRIC_CHECK,
          "out_dir": FOLDER,
          "data_dir": FOLDER,
          "data_args": (_data_args, "a dict of the prepare script's arguments without 'out_dir' (data_dir is the folder)"),
          "split_join": curriculum.CHECK,
          "extra_loops": INT_GE0,
          "loop_sample": num(0, 1, hi_open=True),
          "json": OUTPUT}
for _k in ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "eval_batch_size",
           "eval_iters", "stop_patience"):
    CHECKS[_k] = INT_GE1
for _k in ("max_iters", "warmup_iters", "lr_decay_iters", "keep_every"):
    CHECKS[_k] = INT_GE0


def defaults():
    """Every key train.py takes: GPTConfig's model keys, then the training keys."""
    return {**GPTConfig.defaults(), **KEYS}


def check(config, stated=None):
    """The relations between training keys (each key alone is checked by CHECKS, model keys by GPTConfig), then the
    keys that have no effect (configurator.check_inert: refused when typed, noted when a config file set them;
    stated: configure()'s {key: where}). Returns {inert key: why} (train.py records it in config.json)."""
    if config["keep_every"] % config["eval_interval"]:
        raise ConfigError(f"keep_every={config['keep_every']} is invalid: allowed 0 or a multiple of eval_interval="
                          f"{config['eval_interval']} (checkpoints are written at evaluations)")
    if config["decay_lr"] and config["min_lr"] > config["learning_rate"]:  # a constant rate never reaches min_lr
        raise ConfigError(f"min_lr={config['min_lr']} is above learning_rate={config['learning_rate']}: "
                          "the schedule decays to min_lr, so allowed min_lr <= learning_rate")
    # what a captured step cannot hold (stepgraph.py): Muon's float lr (frozen in the graph), float16's loss scaling (it
    # syncs every step), reduce-overhead's CUDA graphs of its own
    graph_bad = [k for k, bad in (("optimizer", config["optimizer"] != "adamw"), ("dtype", config["dtype"] == "float16"),
                                  ("compile_mode", config["compile"] and config["compile_mode"] == "reduce-overhead")) if bad]
    graph_bad += ["loop_sample"] * (config["loop_sample"] > 0)  # a graph holds one loop count
    if config["cuda_graph"] and graph_bad:
        raise ConfigError(f"cuda_graph=True cannot run with {graph_bad[0]}={config[graph_bad[0]]!r}: allowed optimizer="
                          "'adamw', a dtype other than 'float16', a compile_mode other than 'reduce-overhead', loop_sample=0; or "
                          "cuda_graph=False")
    if config["kv_share"] == "latest":  # a training forward has no cache: each loop reads its own, as without the key
        raise ConfigError("kv_share='latest' is an inference key (each loop reads the last loop each earlier position "
                          "wrote, in generation): it trains as ''; allowed '' or 'first' for training, 'latest' in "
                          "sample.py, eval_harness.py and the export")
    # the model keys' one validator; vocab_size 0 is the data's, checked against it in dataset.check_with_data
    GPTConfig.from_dict({**config, "vocab_size": config["vocab_size"] or max(1, config["phi_topk"])})
    return check_inert(config, defaults(), {**GPTConfig.ACTIVE, **ACTIVE}, stated or {})
