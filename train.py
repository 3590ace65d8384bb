"""
Train DiscoLoop or a baseline. Single process (CPU or one GPU):

    python train.py config/symbolic.py
    python train.py config/symbolic.py --recurrence=loop --out_dir=out/loop

DDP, one node / several nodes:

    torchrun --standalone --nproc_per_node=8 train.py config/pretrain.py
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py config/pretrain.py

Two kinds of data: question-answer folders (dataset='symbolic' or 'nl'; loss on answer tokens,
accuracy per split at the final loop and at Stage-1) and token shards (dataset='pretrain'; loss
on every token, validation loss). Defaults below are the symbolic recipe; config files override.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (DTYPES, DataError, autocast, cpu_has_bf16_flag, model_step_timer, pick_cpu_dtype, resolve_device,
                    resolve_dtype)
from datafolder import kind_of, load_prepare, read_meta
from checkpoint import (RESUME_KEYS, CheckpointError, append_metrics, config_mismatch, early_stop_row, join_iteration,
                        joins_acted, load_checkpoint, lock_run_folder, read_metrics, resume_changes,
                        save_checkpoint, strip_compile_prefix)
from configurator import ConfigError, configure, die, merge, parse_join_rule
from model import GPT, GPTConfig
from shards import TokenData
from tasks import QAData

_not_config = set(globals())  # every name above (imports) is not a config key
# -----------------------------------------------------------------------------
# I/O
out_dir = "out/symbolic"     # run folder: ckpt.pt, metrics.jsonl, config.json
eval_interval = 390          # iterations between evaluations and checkpoints (10 epochs)
log_interval = 10            # iterations between reading the loss back (the only host sync of a step)
eval_only = False            # evaluate the checkpoint in out_dir once and exit
init_from = "scratch"        # 'scratch' or 'resume' (from out_dir/ckpt.pt)
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
block_size = 8               # longest sequence (QA: at least the longest example; pretrain: the window)
eval_batch_size = 2048       # QA: questions per evaluation forward
eval_iters = 50              # pretrain: validation batches per evaluation
stop_metric = ""             # '' = off; else stop early on this evaluation metric, e.g. 'loss/val_id' (loss: lower is better, acc: higher); never a test split
stop_patience = 10           # with stop_metric: stop after this many evaluations without a new best
split_join = {}              # QA curriculum: {training split: iteration it joins the mix, or a rule on a validation metric}, e.g. {"train_id_3hop": 6630} or {"train_id_3hop": "acc/val_id>=0.9"}
# model (see model.GPTConfig)
vocab_size = 0               # embedding rows; 0 = the dataset's vocabulary (larger pads, e.g. to match a parameter count)
n_layer = 1                  # blocks in f_theta (one loop)
n_head = 6                   # attention heads
n_embd = 192                 # model width d
n_hidden = 0                 # MLP hidden width; 0 = 8/3 d (SwiGLU) or 4 d (GELU)
dropout = 0.0                # dropout probability in the blocks
pos_emb = "learned"          # 'learned' | 'rope' | 'none'
rope_theta = 10000.0         # RoPE base
pos_every_loop = False       # learned positions: add them before every loop, not only once
pos_shift = 0                # learned positions, training only: start each sequence at a random position 0..pos_shift (hop extrapolation)
sandwich_norm = False        # Ouro-style: also normalize each sublayer's output
scaled_init = True           # GPT-2's c_proj init 0.02/sqrt(2 n_layer K); False = Ouro's N(0, 0.02) for every Linear
per_loop_norm = False        # Ouro: ln_f after every loop; the normed state feeds the next loop (pretraining: True)
ponder_scale_embeds = False  # PonderLM (hzby/PonderingLM scale_embeds): input embedding times sqrt(d)
ponder_multiply_steps = False  # PonderLM (mutiply_pondering_steps): input embedding times K-1 pondering steps
norm = "rmsnorm"             # 'rmsnorm' | 'layernorm'
mlp = "gelu"                 # GPT-2's MLP for the symbolic base (see README: SwiGLU took the memorization route)
bias = False                 # biases in Linear and LayerNorm (GPT-2 has them)
recurrence = "disco"         # 'disco' | 'loop' | 'none' (K untied copies) | 'ponder' (PonderLM)
n_loop = 2                   # K: applications of f_theta
disco_gate = "fixed"         # 'fixed' (alpha = disco_alpha) | 'learned' (Eq. 5)
disco_alpha = 1.0            # the fixed gate alpha*
disco_tau = 1.0              # softmax temperature of Phi
disco_topk = 0               # 0 = exact Phi over the vocabulary; k > 0 = top-k Phi (Appendix B)
disco_chunk = 0              # positions per chunk when decoding Phi (0 = all): bounds the B x chunk x V logits
label_smoothing = 0.1        # label smoothing of the training loss
loss_chunk = 1024            # positions per chunk of head + cross-entropy: no (B, T, V) logits are ever built
activation_checkpointing = "none"  # 'none' | 'block': recompute each block in backward (pretraining needs it)
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
decay_lr = True              # False = constant learning rate after warmup
lr_schedule = "cosine"       # 'cosine' | 'linear'
warmup_iters = 200           # linear warmup iterations
lr_decay_iters = 17550       # the cosine is laid out over 450 epochs
min_lr = 3e-4                # learning rate at the end of the decay
# system
device = "auto"              # 'auto' | 'cpu' | 'cuda' | 'cuda:1' | 'mps'
dtype = "auto"               # 'auto' | 'float32' | 'bfloat16' | 'float16'
compile = False              # torch.compile the model (a failure is reported, not silent)
seed = 0                     # seed of weights, data order and dropout (>= 0)
threads = 0                  # CPU threads (0 = torch default)
peak_flops = 0.0             # per-device peak FLOP/s for MFU (0 = report TFLOP/s only; bench.py measures one)
memory_check = True          # on CUDA: print the memory plan and stop before allocating if it does not fit
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if k not in _not_config and not k.startswith("_")
               and isinstance(v, (int, float, bool, str, dict))]
try:
    globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], __doc__, __file__))
except ConfigError as e:
    die(e)
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

try:  # model keys: GPTConfig is their one validator (vocab_size 0 = the dataset's, known once it is loaded)
    GPTConfig.from_dict({**config, "vocab_size": vocab_size or max(1, disco_topk)})
except ValueError as e:
    die(e)
if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    die(f"out_dir={out_dir!r} is an existing file, not a folder")
try:  # fail now, not at the first checkpoint
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f".write-test-{os.getpid()}"), "w"):
        pass
    os.remove(os.path.join(out_dir, f".write-test-{os.getpid()}"))
except OSError as e:
    die(f"out_dir={out_dir!r} is not writable ({e.strerror})")

# distributed setup (nanoGPT's): torchrun sets RANK, LOCAL_RANK and WORLD_SIZE
ddp = int(os.environ.get("RANK", -1)) != -1
try:
    device = resolve_device(device)
except ValueError as e:
    die(e)
if ddp:
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if gradient_accumulation_steps % world_size:
        die(f"gradient_accumulation_steps={gradient_accumulation_steps} must be a multiple of WORLD_SIZE={world_size}")
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0
accum_local = gradient_accumulation_steps // world_size
global_batch = batch_size * gradient_accumulation_steps
device_type = "cuda" if device.startswith("cuda") else device.split(":")[0]
if threads:
    torch.set_num_threads(threads)


# -----------------------------------------------------------------------------
# data
data_dir = os.path.abspath(data_dir)
try:
    prep = load_prepare(dataset)
    # prepare on first use, where the prepare script says it is cheap (QA folders: a no-op when this generator
    # made the folder with this config); a token corpus only when data_args says how (a big job of its own)
    if master and (prep.ON_FIRST_USE or (data_args and not os.path.exists(os.path.join(data_dir, "meta.json")))):
        prep.prepare(merge(prep.DEFAULTS, {**data_args, "out_dir": data_dir}, "data_args"))
    if ddp:
        torch.distributed.barrier()
    meta = read_meta(data_dir)
    if meta.get("generator", dataset) != dataset:
        raise DataError(f"data_dir={data_dir!r} holds data made by data/{meta['generator']}/prepare.py, "
                        f"not dataset={dataset!r}")
    # the folder says what it is: one interface for both kinds (vocab_size, config, seq_len, steps_per_epoch,
    # get_batch, evaluate, metric_names)
    if kind_of(meta) == "tokens":
        if split_join:
            die(f"split_join={split_join!r} is for QA datasets; a token corpus has no splits to join: use {{}}")
        data = TokenData(data_dir, block_size, eval_iters, seed)
    else:
        data = QAData(data_dir, block_size, {s: None if isinstance(j, str) else j for s, j in split_join.items()})
        first = int((data.row_join == 0).sum())  # the examples in the mix at iteration 0
        if batch_size * gradient_accumulation_steps > first:
            die(f"batch_size={batch_size} x gradient_accumulation_steps={gradient_accumulation_steps} is more than "
                f"the {first} training examples in the mix at iteration 0 of '{data_dir}': allowed at most {first}")
except (DataError, ConfigError) as e:
    die(e)
data_vocab, data_config = data.vocab_size, data.config
if pos_shift and data.seq_len + pos_shift > block_size:
    die(f"pos_shift={pos_shift} with training sequences of {data.seq_len} tokens needs block_size >= "
        f"{data.seq_len + pos_shift}, not {block_size}")
if stop_metric and stop_metric not in data.metric_names:
    die(f"stop_metric={stop_metric!r} is not among this dataset's metrics: "
        f"{[m for m in data.metric_names if 'val' in m]}")
rule_joins = {s: j for s, j in split_join.items() if isinstance(j, str)}  # splits a validation metric lets in
for name, rule in rule_joins.items():
    metric = parse_join_rule(rule)[0]  # a well-formed rule that can hold (configurator); here: this dataset's?
    if metric not in data.metric_names:
        die(f"split_join[{name!r}]={rule!r}: {metric!r} is not a metric of this dataset "
            f"(e.g. {[m for m in data.metric_names if 'val' in m]})")
if vocab_size and vocab_size < data_vocab:
    die(f"vocab_size={vocab_size} is smaller than the dataset's vocabulary ({data_vocab})")
vocab_size = vocab_size or data_vocab
config["vocab_size"] = vocab_size

# -----------------------------------------------------------------------------
# model, optimizer, checkpoint
model_fields = list(GPTConfig.__dataclass_fields__)
ckpt_path, metrics_path = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "metrics.jsonl")
iter_num, ckpt, elapsed, cpu_elapsed = 0, None, 0.0, 0.0
if master:
    try:  # one run per out_dir; a second one stops here, naming the holder
        run_lock = lock_run_folder(out_dir)
    except CheckpointError as e:
        die(e)
if init_from == "scratch" and not eval_only and not overwrite and os.path.exists(ckpt_path):
    die(f"out_dir '{out_dir}' already holds a checkpoint: continue it with --init_from=resume, "
        "or start over with --overwrite=True (replaces ckpt.pt and metrics.jsonl)")
rows = read_metrics(metrics_path) if init_from == "resume" or eval_only else []  # the run so far (trimmed below)
if init_from == "resume" or eval_only:  # eval_only evaluates the checkpoint in out_dir
    try:
        ckpt = load_checkpoint(ckpt_path, required=RESUME_KEYS)
    except CheckpointError as e:
        die(e)
    changes, why = resume_changes(ckpt["config"], config, ckpt.get("dtype"))
    why = why or config_mismatch(ckpt["model_args"], config, model_fields) \
        or config_mismatch(ckpt.get("data_config", {}), data_config, list(data_config))
    # a curriculum may be changed where it has not acted yet: every join at or after the resume point
    saved_join = ckpt["config"].get("split_join", {})
    was, now = (joins_acted(j, rows, ckpt["iter_num"]) for j in (saved_join, split_join))  # rows: where rules fired
    if not why and any(was.get(s, 0) != now.get(s, 0) for s in set(was) | set(now)):  # not listed: in from 0
        why = (f"split_join: the checkpoint (iteration {ckpt['iter_num']}) was trained with {saved_join!r}, "
               f"now {split_join!r}; only joins at or after iteration {ckpt['iter_num']} may change")
    if why:
        die(f"cannot resume from {ckpt_path}: {why}")
    iter_num = ckpt["iter_num"]
    elapsed = ckpt.get("elapsed", 0.0)  # wall time of the earlier sessions, so "time" reads as one run
    cpu_elapsed = ckpt.get("cpu_elapsed", 0.0)  # and their CPU time
if dtype == "auto" and ckpt is not None and ckpt.get("dtype"):
    dtype = ckpt["dtype"]  # a resumed run keeps the precision it started with (bit-identical resume)
elif dtype == "auto" and device_type != "cpu":
    dtype = resolve_dtype("auto", device)  # a GPU: bf16 where it has it (on a CPU: timed below, on this model)
if device_type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

torch.manual_seed(seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
try:
    gpt_config = GPTConfig.from_dict(config)  # the config keys that are GPTConfig fields
except ValueError as e:
    die(e)
model_args = {k: config[k] for k in model_fields}  # stored in checkpoints
ptdtype = DTYPES.get(dtype, torch.bfloat16)  # what the memory plan assumes ('auto' is a CPU, where there is none)
if device_type == "cuda" and memory_check:
    # measured with fake tensors (nothing allocated), so an OOM-bound config stops here, not at step 1
    from memory import HEADROOM, format_plan, plan
    mem_plan = plan(config, world_size, ptdtype)
    capacity = torch.cuda.get_device_properties(device).total_memory
    if master:
        print(format_plan(mem_plan, config, world_size))
    if mem_plan.total > HEADROOM * capacity:
        die(f"the memory plan needs {mem_plan.total / 1e9:.1f} GB per rank, more than 90% of this GPU's "
            f"{capacity / 1e9:.0f} GB: lower batch_size (raise gradient_accumulation_steps), set "
            f"activation_checkpointing='block', or pass --memory_check=False to try anyway")
model = GPT(gpt_config)
if ckpt is not None:
    model.load_state_dict(strip_compile_prefix(ckpt["model"]))
model.to(device)
dtype_seconds = {}
if dtype == "auto":  # a CPU: bf16 only where THIS model's training step is measured >= 1.25x faster (common.py)
    # rank 0 measures (ranks timing at once would load the same cores) on the first micro-batch; all follow
    x, y = data.get_batch(0, global_batch, 0, gradient_accumulation_steps, seed)  # one micro-batch
    timer = model_step_timer(model, x.to(device), y.to(device))
    choice = torch.tensor([list(DTYPES).index(pick_cpu_dtype(cpu_has_bf16_flag(), timer)) if master else 0])
    if ddp:
        torch.distributed.broadcast(choice, 0)
    dtype, dtype_seconds = list(DTYPES)[choice.item()], timer.seconds
ptdtype = DTYPES[dtype]
ctx = autocast(device, dtype)


optimizers = model.configure_optimizers(optimizer, learning_rate, weight_decay, (beta1, beta2), adam_eps,
                                        muon_momentum, fused=device_type == "cuda")
if ckpt is not None:
    if not eval_only and (len(ckpt["optimizers"]) != len(optimizers) or not all(s.get("state") for s in ckpt["optimizers"])):
        die(f"cannot resume from {ckpt_path}: it holds no optimizer state for this run's {len(optimizers)} "
            "optimizer(s); a fresh optimizer would not continue the run")
    for opt, state in zip(optimizers, ckpt["optimizers"]):
        opt.load_state_dict(state)
    torch.set_rng_state(ckpt["rng_cpu"])
    if device_type == "cuda" and "rng_cuda" in ckpt:
        torch.cuda.set_rng_state(ckpt["rng_cuda"])
ema = None
if ema_decay > 0:  # weight averaging: smooths the late-training swings of OOD accuracy
    import copy
    ema = copy.deepcopy(model).requires_grad_(False)
    if ckpt is not None and "ema" in ckpt:
        ema.load_state_dict(ckpt["ema"])
    ema_params, model_params = list(ema.parameters()), list(model.parameters())
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
raw_model = model
if compile:
    model = torch.compile(model)  # compiles at the first step; a failure there is reported and runs eager
    if master:
        print("torch.compile on (the first step compiles)")
if ddp:
    # gradient_as_bucket_view: the gradients live in DDP's buckets, no second fp32 copy (the memory plan counts one)
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, gradient_as_bucket_view=True)
last = ckpt.get("last", {}) if ckpt is not None else {}  # restored, so rows after a resume have loss/lr
del ckpt


def get_lr(it):
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if lr_schedule == "cosine" else 1.0 - ratio
    return min_lr + coeff * (learning_rate - min_lr)


def get_batch(it, micro):
    x, y = data.get_batch(it, global_batch, rank * accum_local + micro, gradient_accumulation_steps, seed)  # (B, T) each
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


slow_eval = float(os.environ.get("DISCOLOOP_TEST_SLOW_EVAL", 0))  # seconds per piece: lets tests interrupt an evaluation


@torch.no_grad()
def evaluate():
    """Metrics of the EMA (or raw) weights, or None when a stop request arrives meanwhile: a SIGTERM
    does not wait for a long evaluation (the resumed run evaluates this iteration instead)."""
    m = ema if ema is not None else raw_model
    m.eval()
    out = data.evaluate(m, eval_batch_size, device=device, ctx=ctx,
                        should_stop=lambda: time.sleep(slow_eval) or stop_requested)
    m.train()
    return out


def checkpoint_obj():
    obj = {"model": raw_model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
           "model_args": model_args, "config": config, "data_config": data_config,
           "iter_num": iter_num, "dtype": dtype, "elapsed": round(time.time() - t_start, 2),
           "cpu_elapsed": round(time.process_time() - cpu_start, 2), "rng_cpu": torch.get_rng_state(),
           "last": last}  # the latest loss/lr/throughput, so rows written right after a resume have them
    if device_type == "cuda":
        obj["rng_cuda"] = torch.cuda.get_rng_state()
    if ema is not None:
        obj["ema"] = ema.state_dict()
    return obj


# metrics.jsonl: on resume drop entries written after the checkpoint, so the file reads as one run
if master and not eval_only:  # eval_only changes no file but the row it appends
    if init_from == "scratch" and os.path.exists(metrics_path):
        os.remove(metrics_path)  # only reached with overwrite=True (or no checkpoint yet)
    elif os.path.exists(metrics_path):
        rows = [r for r in rows if r.get("iter", -1) <= iter_num]
        tmp = f"{metrics_path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(tmp, metrics_path)
    # config.json: the config the weights are trained with, and every resume with what it changed
    resumes = []
    if init_from == "resume" and os.path.exists(os.path.join(out_dir, "config.json")):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(os.path.join(out_dir, "config.json")) as f:
                resumes = list(json.load(f).get("resumes", []))
    if init_from == "resume":
        resumes.append({"iter": iter_num, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "changed": changes})
    tmp = os.path.join(out_dir, f"config.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({**config, "dtype_resolved": dtype, "dtype_seconds": dtype_seconds, "resumes": resumes}, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "config.json"))
    print(f"{recurrence} K={n_loop}: {raw_model.get_num_params() / 1e6:.3f}M parameters, device {device}, dtype {dtype}"
          + (f", world size {world_size}" if ddp else ""))
if wandb_log and master:
    import wandb
    try:
        wandb.init(project=wandb_project, name=wandb_run_name, config=config, resume="allow")
    except Exception as e:  # no login, no network: say so before any training, not as wandb's traceback
        die(f"wandb_log=True but wandb could not start ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}): "
            "run `wandb login`, set WANDB_MODE=offline, or pass --wandb_log=False")

stop_requested = False


def request_stop(signum, frame):
    """SIGTERM / Ctrl-C: finish the step (or abandon an evaluation), save, exit 0. A second one: exit now."""
    global stop_requested
    if stop_requested:
        os.write(2, f"error: second {signal.Signals(signum).name}: exiting at once without saving; the last "
                    f"checkpoint on disk is intact\n".encode())
        os._exit(130)
    stop_requested = True


signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)
# under DDP a signal reaches the ranks at different moments: they agree on stopping through a small
# CPU (gloo) all-reduce each step, so no rank leaves while another waits in a collective
ctrl_group = torch.distributed.new_group(backend="gloo") if ddp else None


def agreed_stop():
    if not ddp:
        return stop_requested
    flag = torch.tensor([int(stop_requested)])
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=ctrl_group)
    return bool(flag.item())

# -----------------------------------------------------------------------------
steps_per_epoch = data.steps_per_epoch(global_batch)  # 0 for token shards: a budget, not epochs
seq_len = data.seq_len
tokens_per_iter = global_batch * seq_len
flops_per_iter = raw_model.flops_per_token(seq_len) * tokens_per_iter
if master and not steps_per_epoch:  # a token budget: say what a step and the run are worth
    print(f"tokens per iteration {tokens_per_iter:,} ({world_size} processes x {accum_local} micro-steps x "
          f"{batch_size} x {block_size}); {max_iters} iterations = {tokens_per_iter * max_iters:,} tokens")
bar = None
if master:
    from tqdm import tqdm
    bar = tqdm(total=max_iters, initial=iter_num, dynamic_ncols=True, disable=None, mininterval=1.0)


def micro_step(x, y):
    global loss_sum
    sync = contextlib.nullcontext() if (not ddp or micro == accum_local - 1) else model.no_sync()
    with sync:
        with ctx:
            _, loss = model(x, y)  # x, y: (B, T) tokens and targets; loss: a scalar (no (B, T, V) logits)
            loss = loss / accum_local
        scaler.scale(loss).backward()
    loss_sum += loss.detach().float()


def check_finite():
    """Stop if a loss or gradient went non-finite or the weights did. Called before every save, so
    no checkpoint ever holds poisoned weights (one host sync: only when logging or saving)."""
    bad = nonfinite | ~torch.isfinite(torch.stack(torch._foreach_norm(list(raw_model.parameters())))).all()
    if ddp:
        bad = bad.to(torch.int32)
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    if bad.item():
        kept = (f"the last good checkpoint ({ckpt_path}, iteration {saved_at}) is kept" if saved_at >= 0
                else "no checkpoint was written")
        die(f"loss, gradients or weights became non-finite before iteration {iter_num}; stopping, {kept} "
            "(try a lower learning_rate or dtype=float32)")


nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # set on device, read only by check_finite
compiled_once = False
t0, t_start = time.time(), time.time() - elapsed
cpu_start = time.process_time() - cpu_elapsed  # CPU seconds of this process (all its threads): budgets on a shared machine
# the resumed iteration's evaluation is in metrics.jsonl, unless a stop abandoned it: then it runs now
# (an --eval_only row does not count: the curriculum and early-stop rules read only the run's own rows)
evaluated_at = iter_num if any(r.get("iter") == iter_num and not r.get("eval_only") for r in rows) else -1
saved_at = iter_num if init_from == "resume" else -1  # the iteration in ckpt.pt (-1: none yet)
early_stopped = False


def apply_rule_joins():
    """Let in every split whose rule has held at an evaluation so far. Read from the rows of
    metrics.jsonl, so a resumed run joins where the uninterrupted one did; rank 0 decides, all follow."""
    if not rule_joins:
        return
    fired = [join_iteration(rows, rule) if master else None for rule in rule_joins.values()]
    its = torch.tensor([-1 if j is None else j for j in fired])
    if ddp:
        torch.distributed.broadcast(its, src=0, group=ctrl_group)
    for (name, rule), j in zip(rule_joins.items(), its.tolist()):
        if j >= 0 and data.split_join[name] is None:
            data.set_join(name, j)
            if master:
                print(f"{name} joins the mix at iteration {j} ({rule} held there)")


apply_rule_joins()  # a resumed run: the joins its rows already decided


def out_of_patience():
    """True when stop_metric has not improved for stop_patience evaluations. Read from the rows of
    metrics.jsonl, so a resumed run takes the same decision as an uninterrupted one."""
    i = early_stop_row(rows, stop_metric, stop_patience) if stop_metric else None
    if i is None:
        return False
    print(f"early stop at iteration {iter_num}: {stop_metric} has not improved in {stop_patience} evaluations "
          f"(stop decided at iteration {rows[i]['iter']})")
    return True


def log_row(metrics):
    row = {"iter": iter_num, "time": round(time.time() - t_start, 2), "cpu_time": round(time.process_time() - cpu_start, 2)}
    if steps_per_epoch:
        row["epoch"] = round(iter_num / steps_per_epoch, 2)
    row |= metrics | last
    append_metrics(metrics_path, row)
    rows.append(row)
    if wandb_log:
        wandb.log(row, step=iter_num)
    bar.set_postfix({k.replace("acc/", ""): v for k, v in row.items()
                     if k.startswith("acc/test") or k == "val_loss"}, refresh=False)
    bar.write(json.dumps(row))


if eval_only:  # evaluate the checkpoint in out_dir, append one row, change nothing else
    if master:
        metrics = evaluate()
        if metrics is not None:
            log_row({"eval_only": True} | metrics)
    if ddp:
        destroy_process_group()
    sys.exit(0)

while True:
    stop = agreed_stop()  # every rank takes the same decision at the same step
    # ---- once in a while: evaluate, save, and stop when asked or done ----
    at_eval = iter_num % eval_interval == 0 or iter_num >= max_iters
    if at_eval or stop:
        check_finite()  # never evaluate or save poisoned weights
        if master and at_eval and not stop and iter_num != evaluated_at:
            metrics = evaluate()  # None if a stop request arrived meanwhile: it is not waited for
            if metrics is not None:
                log_row(metrics)
                evaluated_at = iter_num
        stop = stop or (not ddp and stop_requested)
        if at_eval and stop_metric:  # rank 0 evaluated: it decides, every rank follows at this same step
            early = torch.tensor([int(master and out_of_patience())])
            if ddp:
                torch.distributed.broadcast(early, src=0, group=ctrl_group)
            early_stopped = bool(early.item())
        if at_eval:
            apply_rule_joins()
        if master and iter_num > 0 and iter_num != saved_at:
            try:
                save_checkpoint(checkpoint_obj(), ckpt_path)
            except CheckpointError as e:
                die(e)
            saved_at = iter_num
        if iter_num >= max_iters or stop or early_stopped:
            if master and stop:
                print(f"stopped at iteration {iter_num}; " + (
                    "checkpoint saved, continue with --init_from=resume" if saved_at == iter_num else
                    "no checkpoint was written yet (nothing to resume)"))
            break

    # ---- one optimization step: gradients accumulated over micro-batches, no host sync ----
    lr = get_lr(iter_num)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
    loss_sum = torch.zeros((), device=device)  # summed on the device; read back only when logging
    for micro in range(accum_local):
        x, y = get_batch(iter_num, micro)  # this rank's micro-batch: (batch_size, seq_len) each
        try:
            micro_step(x, y)
        except Exception as e:  # the first step compiles: say why it failed, then run eager
            if isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e):
                die(f"out of memory in the training step (batch_size={batch_size} x block_size={block_size} per "
                    "micro-step): lower batch_size and raise gradient_accumulation_steps, or set "
                    "activation_checkpointing='block'")
            if not compile or compiled_once:
                raise
            if ddp:
                die(f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                    "rerun with --compile=False")
            print(f"warning: torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                  "running eager", file=sys.stderr)
            model = raw_model
            raw_model.zero_grad(set_to_none=True)
            micro_step(x, y)
        compiled_once = True
    if grad_clip > 0:
        for opt in optimizers:
            scaler.unscale_(opt)
        nonfinite |= ~torch.isfinite(torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip))
    nonfinite |= ~torch.isfinite(loss_sum)
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if ema is not None:
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, model_params, 1 - ema_decay)
    iter_num += 1
    if master:
        bar.update(1)

    # ---- once in a while: read the loss back (the step's only host sync) and check it ----
    if iter_num % log_interval == 0:
        if ddp:  # every rank logs the same number
            torch.distributed.all_reduce(loss_sum)
            loss_sum /= world_size
        check_finite()
        loss_val = loss_sum.item()
        dt = (time.time() - t0) / log_interval
        t0 = time.time()
        last = {"loss": round(loss_val, 5), "lr": lr, "tok_per_s": round(tokens_per_iter / dt),
                "tflops": round(flops_per_iter / dt / world_size / 1e12, 4)}
        if peak_flops:
            last["mfu"] = round(flops_per_iter / dt / world_size / peak_flops, 4)
        if master:
            bar.set_description(f"loss {loss_val:.4f}", refresh=False)

# the work is saved: a signal arriving during teardown (e.g. a cluster's SIGTERM to every rank after one
# rank's stop was agreed) must not turn a clean exit into a kill
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
if bar is not None:
    bar.close()
if ddp:
    destroy_process_group()
