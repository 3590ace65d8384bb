"""
Train DiscoLoop or a baseline: one process (CPU or one GPU), or DDP on one or several nodes.

    python train.py config/symbolic.py --recurrence=loop --out_dir=out/loop
    torchrun --standalone --nproc_per_node=8 train.py config/pretrain.py
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py config/pretrain.py

Question-answer folders (loss on answer tokens, accuracy per split) or token shards (loss on every token).
Model keys default to GPTConfig's; a config file sets the recipe (config/).
"""
import contextlib
import copy
import functools
import json
import math
import os
import random
import signal
import sys
import time

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from discoloop import train_config
from discoloop.branch import load_branch, load_branch_weights
from discoloop.checkpoint import earlier_work, keep_copy, load_for_resume, restore_training, resume_architecture, save_checkpoint
from discoloop.common import (DTYPES, ERRORS, any_rank, autocast, die, out_of_memory, rank0_decides, resolve_device,
                    stop_on_signals)
from configurator import configure
from discoloop.curriculum import rule_metrics
from discoloop.dataset import check_with_data, open_data, prepare_weights
from discoloop.memory import check_fits, device_bytes
from model import GPT, GPTConfig
from discoloop.precision import decide_dtype
from discoloop.runlog import RunLog, open_run_folder
from discoloop.tokenizer import data_tokenizer, record

# -----------------------------------------------------------------------------
# every key, its default and its meaning: train_config.py (GPTConfig's model keys, then the training keys)
branch, branch_facts, stated = None, {}, {}  # stated: {key: the config file or command line that sets it}
try:  # every key's one check: train_config.CHECKS here, GPTConfig's for the model keys
    config = configure(train_config.defaults(), sys.argv[1:], __doc__, [train_config.__file__, sys.modules[GPTConfig.__module__].__file__],
                       train_config.CHECKS, stated)
    if not config["vocab_size"]:  # 0 = the data's: it states no size
        stated.pop("vocab_size", None)
    if config["init_from"] == "resume" or config["eval_only"]:  # the weights' architecture where the command is silent
        config.update(resume_architecture(os.path.join(config["out_dir"], "ckpt.pt"), config, stated))
    elif config["init_from"] != "scratch":  # a new run from another run's (or a Hugging Face model's) weights
        if int(os.environ.get("RANK", 0)) == 0:  # e.g. data/smollm2/out, made on first use (under DDP: prepare it first)
            prepare_weights(config["init_from"])
        *branch, model_keys, branch_facts = load_branch(config["init_from"], config, stated)
        config.update(model_keys)  # a Hugging Face folder's architecture, before the model check
    branch_facts["inert"] = train_config.check(config, stated)  # keys that do nothing here: refused if typed, else noted
except (ValueError, *ERRORS) as e:
    die(e)
globals().update(config)  # nanoGPT's style: every key is a name below (model keys are read as config[...])

# -----------------------------------------------------------------------------
# processes and device (nanoGPT's DDP setup: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE)
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
if device_type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
ctrl_group = torch.distributed.new_group(backend="gloo") if ddp else None  # stop/early-stop/join agreement (common.py)

# -----------------------------------------------------------------------------
# data: the folder says what it is (meta.json's kind); data/<dataset>/prepare.py makes it on first use
data_dir = os.path.abspath(data_dir)
rule_joins = {s: j for s, j in split_join.items() if isinstance(j, str)}  # splits a validation metric lets in
try:
    # QA data: Stage-1 accuracy where the plots (stage1_splits) and the stop and join rules read it; loops per hop
    qa = dict(stage1_splits=stage1_splits, stage1_metrics=[stop_metric, *rule_metrics(split_join)],
              loops_by_hops=loops_by_hops, extra_loops=extra_loops)
    data = open_data(dataset, data_dir, data_args, block_size, eval_iters, seed, split_join, make=master,
                     barrier=torch.distributed.barrier if ddp else None, qa=qa)
    check_with_data(config, data, train_config.KEYS)  # metric names, pos_shift, vocab, the first batch
    # the checkpoint carries its tokenizer (a vocabulary, a tokenizer.json, or a tiktoken name and hash), so a
    # re-prepared folder or a replaced file cannot make sample.py or the export decode with another one
    tok = data_tokenizer(data)  # None: shards of no generator
    tok_record = record(tok) if tok is not None else None
except ERRORS as e:
    die(e)
sparse = data.sparse_targets  # QA: one answer token per question, the head runs on the answer rows alone
vocab_size = config["vocab_size"] = vocab_size or data.vocab_size

# -----------------------------------------------------------------------------
# the run folder: train.py's own (folder_owner.claim), one run at a time; a resume continues what its checkpoint trained
try:  # fail now, not at the first checkpoint; a second run on out_dir stops here, naming the holder
    run_lock = open_run_folder(out_dir, lock=master)
    earlier = earlier_work(out_dir, eval_only)  # an earlier run's checkpoints and metrics, each with the mark
except ERRORS as e:
    die(e)
ckpt_path, log = os.path.join(out_dir, "ckpt.pt"), RunLog(out_dir)
if init_from != "resume" and not eval_only and earlier:
    if not overwrite:
        die(f"out_dir '{out_dir}' already holds an earlier run's {sorted(earlier)[0]}: continue it with "
            "--init_from=resume, or start over with --overwrite=True (replaces its checkpoints and metrics.jsonl)")
    for name in earlier if master else []:  # the earlier run's checkpoints go now: none is mistaken for this run's
        if name != "metrics.jsonl":
            os.remove(os.path.join(out_dir, name))
ckpt, iter_num, changes = None, 0, {}
if init_from == "resume" or eval_only:  # eval_only evaluates the checkpoint in out_dir
    try:
        ckpt, changes = load_for_resume(ckpt_path, config, data.config, log.read(), train_config.defaults())
    except ERRORS as e:
        die(e)
    iter_num = ckpt["iter_num"]

# -----------------------------------------------------------------------------
# precision, decided once before the memory check (what and why: config.json; the checkpoint keeps what); the model
model_args = {k: config[k] for k in GPTConfig.__dataclass_fields__}  # stored in checkpoints


@functools.cache
def new_model():  # built once: a CPU's dtype='auto' times THIS model's step before the run uses it
    torch.manual_seed(seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    m = GPT(GPTConfig.from_dict(config))
    if ckpt is not None:
        m.load_state_dict(ckpt["model"])
    elif branch is not None:
        try:
            fresh = load_branch_weights(m, branch[0], init_from)  # e.g. DiscoLoop's gate, new to a vanilla loop's run
            branch_facts["init_fresh"] = sorted(set(branch_facts.get("init_fresh", []) + fresh))
        except ERRORS as e:
            die(e)
    return m


dtype, dtype_source, dtype_seconds = decide_dtype(  # a CPU: rank 0 times the first micro-batch (ranks timing at once
    dtype, device, ckpt and ckpt.get("dtype_resolved"), new_model if master else None,  # would share the cores)
    lambda: data.get_batch(0, global_batch, 0, gradient_accumulation_steps, seed)[:2], model_args)
dtype = list(DTYPES)[rank0_decides(list(DTYPES).index(dtype), ctrl_group)]
config["activation_checkpointing"], why = check_fits(config, world_size, DTYPES[dtype], device_bytes(device), memory_check, master)
model_args["activation_checkpointing"] = config["activation_checkpointing"]  # 'auto' resolved: config.json, checkpoints
if why:  # the memory plan (fake tensors, on CUDA) does not fit: an OOM-bound config stops here, not at step 1
    die(why)
model = new_model().to(device)
ctx = autocast(device, dtype)
optimizers = model.configure_optimizers(optimizer, learning_rate, weight_decay, (beta1, beta2), adam_eps,
                                        muon_momentum, fused=device_type == "cuda")
ema = copy.deepcopy(model).requires_grad_(False) if ema_decay > 0 else None  # weight average: evaluated, probed
if ema is not None and branch is not None and branch[1] is not None:
    load_branch_weights(ema, branch[1], init_from)  # a branch continues its source's average too
eval_model = ema if ema is not None else model
if ckpt is not None:
    try:
        restore_training(ckpt, ckpt_path, optimizers, ema, device_type, need_optimizer=not eval_only)
    except ERRORS as e:
        die(e)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
raw_model = model
if compile:  # each block on its own (GPT.compile_blocks); the first step compiles, a failure there runs eager
    raw_model.compile_blocks(mode=compile_mode)
    if master:
        print(f"torch.compile on, per block, mode {compile_mode!r} (the first step compiles)")
if ddp:
    # gradient_as_bucket_view: the gradients live in DDP's buckets, no second fp32 copy (the memory plan counts one)
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, gradient_as_bucket_view=True)
# carried across a resume: wall and CPU time of earlier sessions (so "time" reads as one run), the latest
# loss/lr (so rows written right after a resume have them)
elapsed, cpu_elapsed = (ckpt.get("elapsed", 0.0), ckpt.get("cpu_elapsed", 0.0)) if ckpt is not None else (0.0, 0.0)
last = ckpt.get("last", {}) if ckpt is not None else {}
del ckpt


def get_lr(it):
    """Linear warmup, then cosine or linear decay to min_lr at lr_decay_iters (or constant)."""
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if lr_schedule == "cosine" else 1.0 - ratio
    return min_lr + coeff * (learning_rate - min_lr)


@torch.no_grad()
def evaluate(m, stop):
    """Metrics of model m (the EMA when there is one), or None when a stop request arrives meanwhile: a
    SIGTERM does not wait for a long evaluation (the resumed run evaluates this iteration instead)."""
    m.eval()
    # eager: compile=True compiles the training step's one graph, not one more per evaluation shape and grad mode
    with torch.compiler.set_stance("force_eager") if compile else contextlib.nullcontext():  # (importing it: seconds)
        out = data.evaluate(m, eval_batch_size, device=device, ctx=ctx, should_stop=stop.is_set)
    m.train()
    return out


def nonfinite_anywhere(flag, with_state):
    """True if a loss or gradient was flagged non-finite on the device, or a weight (with_state: or optimizer
    state, AdamW's moments, Muon's momentum) is, on any rank (one host sync): a checkpoint is checked before
    it is written."""
    state = [t for o in optimizers for st in o.state.values() for t in st.values()
             if with_state and torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0]
    bad = (flag | ~torch.isfinite(torch.stack(torch._foreach_norm(list(raw_model.parameters()) + state))).all())
    if ddp:
        bad = bad.to(torch.int32)
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    return bool(bad.item())


def stop_nonfinite(it, saved_at, resumed_at):
    if it == resumed_at:  # nothing trained yet in this process: the checkpoint itself holds them (ours never does)
        die(f"checkpoint '{ckpt_path}' (iteration {it}) holds non-finite weights or optimizer state: resume from "
            "another copy, or start over with --overwrite=True")
    kept = (f"the last good checkpoint ({ckpt_path}, iteration {saved_at}) is kept" if saved_at >= 0
            else "no checkpoint was written")
    die(f"loss, gradients or weights became non-finite before iteration {it}; stopping, {kept} "
        "(try a lower learning_rate or dtype=float32)")


# -----------------------------------------------------------------------------
# the run starts: metrics.jsonl trimmed to the checkpoint, config.json with this resume, a signal handler
steps_per_epoch = data.steps_per_epoch(global_batch)  # 0 for token shards: a budget, not epochs
tokens_per_iter = global_batch * data.seq_len
flops_per_iter = raw_model.flops_per_token(data.seq_len) * tokens_per_iter
if master and not eval_only:  # eval_only changes no file but the row it appends
    log.start(iter_num, config, resumed=init_from == "resume", changes=changes, dtype_resolved=dtype,
              dtype_seconds=dtype_seconds, dtype_decided=dtype_source, **branch_facts)
    print(f"{config['recurrence']} K={config['n_loop']}: {raw_model.get_num_params() / 1e6:.3f}M parameters, device {device}, dtype {dtype}"
          + (f", world size {world_size}" if ddp else ""))
    if not steps_per_epoch:  # a token budget: say what a step and the run are worth
        print(f"tokens per iteration {tokens_per_iter:,} ({world_size} processes x {accum_local} micro-steps x "
              f"{batch_size} x {block_size}); {max_iters} iterations = {tokens_per_iter * max_iters:,} tokens")
try:
    if wandb_log and master:
        log.start_wandb(wandb_project, wandb_run_name, config)
except ERRORS as e:
    die(e)
stop = stop_on_signals()  # SIGTERM / Ctrl-C: finish the step (or abandon an evaluation), save, exit 0
bar = tqdm(total=max_iters, initial=iter_num, dynamic_ncols=True, disable=None, mininterval=1.0) if master else None
t0, t_start, cpu_start = time.time(), time.time() - elapsed, time.process_time() - cpu_elapsed


def log_row(metrics):
    row = {"iter": iter_num, "time": round(time.time() - t_start, 2), "cpu_time": round(time.process_time() - cpu_start, 2)}
    if steps_per_epoch:
        row["epoch"] = round(iter_num / steps_per_epoch, 2)
    row |= metrics | last
    log.append(row)
    bar.set_postfix({k.replace("acc/", ""): v for k, v in row.items() if k.startswith("acc/test") or k == "val_loss"},
                    refresh=False)
    bar.write(json.dumps(row))


if eval_only:  # evaluate the checkpoint in out_dir, append one row, change nothing else
    metrics = evaluate(eval_model, stop) if master else None
    if metrics is not None:
        log_row({"eval_only": True} | metrics)
    if ddp:
        destroy_process_group()
    sys.exit(0)


def batches(it):  # this rank's micro-batches of iteration it on the device: [(x, y, loops)]
    pin = device_type == "cuda"
    return [tuple(t if t is None else (t.pin_memory() if pin else t).to(device, non_blocking=pin) for t in
                  data.get_batch(it, global_batch, rank * accum_local + m, gradient_accumulation_steps, seed))
            for m in range(accum_local)]


def step_loops(it):
    """loop_sample: the loop count of step `it` (None: all K), drawn from the seed and the iteration alone, so every
    rank and a resumed run draw the same."""
    draw = random.Random(f"loop_sample:{seed}:{it}")  # a str seed hashes the same in every process
    return draw.randint(1, n_loop - 1) if loop_sample and draw.random() < loop_sample else None


def train_step(micro_batches):
    """One optimization step with no host sync (cuda_graph=True replays it whole: stepgraph.py): each micro-batch's loss
    (a scalar: no (B, T, V) logits are ever built) and gradients (DDP all-reduces them on the last micro-step), the
    clip, the optimizers' step, the weight average; returns the summed loss, on the device (read when logging)."""
    loss_sum = torch.zeros((), device=device)
    for m, (x, y, loops) in enumerate(micro_batches):  # loops: each row's loop count (loops_by_hops) or None
        with model.no_sync() if ddp and m < accum_local - 1 else contextlib.nullcontext():
            with ctx:  # sparse: only the rows with a target (QA answers) reach the head; a graph's shapes are fixed
                loss = model(x, y, sparse_targets=sparse and not cuda_graph, loops=loops,
                             n_loop=step_loops(iter_num))[1] / accum_local
            scaler.scale(loss).backward()
        loss_sum += loss.detach().float()
    if grad_clip > 0:
        for opt in optimizers:
            scaler.unscale_(opt)
        nonfinite.logical_or_(~torch.isfinite(torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)))
    nonfinite.logical_or_(~torch.isfinite(loss_sum))
    for opt in optimizers:
        scaler.step(opt)
        opt.zero_grad(set_to_none=True)
    scaler.update()
    if ema is not None:
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(raw_model.parameters()), 1 - ema_decay)
    return loss_sum


def step_failed(e, compiled_once):
    """A step that raised: out of memory is one line with the step's advice; the first compiled step's failure is
    reported and the step runs again eager; anything else is a bug and raises."""
    if out_of_memory(e):  # common.py's one test of an allocation failure
        die(f"out of memory in the training step (batch_size={batch_size} x block_size={block_size} per micro-step): "
            "lower batch_size and raise gradient_accumulation_steps, or set activation_checkpointing='block'")
    if not compile or compiled_once:
        raise e
    if stop.is_set():  # a SIGTERM (a time limit) killed the compiler's workers too: out of time, not a failure
        sys.exit("stopped during torch.compile's first step by a stop request: out of time, not a compile failure")
    why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    if ddp:  # ranks must not differ in what they run
        die(f"torch.compile failed ({why}); rerun with --compile=False")
    print(f"warning: torch.compile failed ({why}); running eager", file=sys.stderr)
    raw_model.compile_blocks(enable=False)
    raw_model.zero_grad(set_to_none=True)
    return step(batches(iter_num))


step = train_step
if cuda_graph:
    from discoloop.stepgraph import StepGraph  # loaded only by the runs that ask for a graph
    try:  # where a graph cannot hold the step (DDP, float16, no capturable optimizer): one line, exit 2
        step = StepGraph(train_step, optimizers, raw_model, device, ddp, dtype)
    except ERRORS as e:
        die(e)
nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # set on the device, read when logging or saving
saved_at = iter_num if init_from == "resume" else -1  # the iteration in ckpt.pt (-1: none yet)
resumed_at = iter_num if init_from == "resume" else -1  # where this process took over
compiled_once, first_pass = False, True
while True:
    # ---- once in a while: evaluate, decide (joins, early stop), save, and stop when asked or done ----
    stopping = any_rank(stop.is_set(), ctrl_group)  # every rank takes the same decision at the same step
    at_eval = iter_num % eval_interval == 0 or iter_num >= max_iters
    early_stopped = False
    if at_eval or stopping:
        if nonfinite_anywhere(nonfinite, with_state=True):  # never evaluate or save poisoned weights or optimizer state
            stop_nonfinite(iter_num, saved_at, resumed_at)
        # the resumed iteration's evaluation is in metrics.jsonl, unless a stop abandoned it: then it runs now
        if master and at_eval and not stopping and not log.evaluated(iter_num):
            metrics = evaluate(eval_model, stop)  # None if a stop request arrived meanwhile
            if metrics is not None:
                log_row(metrics)
        stopping = stopping or (not ddp and stop.is_set())
        if at_eval and stop_metric:  # rank 0 evaluated: it decides, every rank follows at this same step
            row = log.early_stop(stop_metric, stop_patience) if master else None
            if row is not None:
                print(f"early stop at iteration {iter_num}: {stop_metric} has not improved in {stop_patience} "
                      f"evaluations (stop decided at iteration {row['iter']})")
            early_stopped = bool(rank0_decides(row is not None, ctrl_group))
    if (at_eval or first_pass) and rule_joins:  # from the rows (rank 0's; all follow): a resume joins as before
        fired = log.fired_joins(rule_joins) if master else {}
        for name in rule_joins:
            j = rank0_decides(fired.get(name, -1), ctrl_group)
            if j >= 0 and data.split_join[name] is None:
                data.set_join(name, j)
                if master:
                    print(f"{name} joins the mix at iteration {j} ({rule_joins[name]} held there)")
    if at_eval or stopping:
        if master and iter_num > 0 and iter_num != saved_at:
            obj = {"model": raw_model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                   "model_args": model_args, "config": config, "data_config": data.config, "iter_num": iter_num,
                   "dtype_resolved": dtype, "elapsed": round(time.time() - t_start, 2),
                   "cpu_elapsed": round(time.process_time() - cpu_start, 2), "rng_cpu": torch.get_rng_state(),
                   "last": last, **({"rng_cuda": torch.cuda.get_rng_state()} if device_type == "cuda" else {}),
                   **({"ema": ema.state_dict()} if ema is not None else {}),
                   **({"tokenizer": tok_record} if tok_record else {})}
            try:
                save_checkpoint(obj, ckpt_path)
                if keep_every and iter_num % keep_every == 0:  # a copy to probe later (a hard link where it can be)
                    keep_copy(ckpt_path, os.path.join(out_dir, f"ckpt_{iter_num}.pt"))
            except ERRORS as e:
                die(e)
            saved_at = iter_num
        if iter_num >= max_iters or stopping or early_stopped:
            if master and stopping:
                print(f"stopped at iteration {iter_num}; " + (
                    "checkpoint saved, continue with --init_from=resume" if saved_at == iter_num else
                    "no checkpoint was written yet (nothing to resume)"))
            break
    first_pass = False

    # ---- one optimization step (train_step: gradients over the micro-batches, clip, optimizers, EMA), no host sync ----
    lr = get_lr(iter_num)
    for opt in optimizers:
        for group in opt.param_groups:  # a captured step reads its lr from a device tensor (stepgraph.py)
            group["lr"] = group["lr"].fill_(lr) if torch.is_tensor(group["lr"]) else lr
    try:
        loss_sum = step(batches(iter_num))
    except Exception as e:  # an allocation failure gets the step's own advice; a failed first compile runs eager
        loss_sum = step_failed(e, compiled_once)
    compiled_once = True
    iter_num += 1
    if master:
        bar.update(1)

    # ---- once in a while: read the loss back (the step's only host sync) and check it ----
    if iter_num % log_interval == 0:
        if ddp:  # every rank logs the same number
            torch.distributed.all_reduce(loss_sum)
            loss_sum /= world_size
        if nonfinite_anywhere(nonfinite, with_state=False):  # the state is checked before saves
            stop_nonfinite(iter_num, saved_at, resumed_at)
        dt, t0 = (time.time() - t0) / log_interval, time.time()
        last = {"loss": round(loss_sum.item(), 5), "lr": lr, "tok_per_s": round(tokens_per_iter / dt),
                "tflops": round(flops_per_iter / dt / world_size / 1e12, 4)}
        if peak_flops:
            last["mfu"] = round(flops_per_iter / dt / world_size / peak_flops, 4)
        if master:
            bar.set_description(f"loss {last['loss']:.4f}", refresh=False)

# the work is saved: a signal arriving during teardown (e.g. a cluster's SIGTERM to every rank after one
# rank's stop was agreed) must not turn a clean exit into a kill
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
if bar is not None:
    bar.close()
if ddp:
    destroy_process_group()
