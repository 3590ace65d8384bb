"""
train.py's cuda_graph=True: the whole training step replayed as one CUDA graph. A small model's step is a few hundred
kernels of microseconds each, so the host's launches set its pace, not the GPU (config/symbolic.py, 0.65M parameters:
0.25-0.46 s an epoch on an H200, RESULTS.md). Captured once, every micro-step's forward and backward, the clip, AdamW
and the weight average are one launch. PyTorch's recipe (docs "CUDA Graphs", whole-network capture), and what
train.py's step gives it:
  - no host sync, no shape that depends on values: the loss runs over every row with -1 targets masked
    (model.forward's sparse_targets=False: the same loss, up to rounding); the flags and the loss stay on the device;
  - inputs at fixed addresses: each iteration's micro-batches are copied into the buffers the graph reads;
  - a learning rate the graph reads: AdamW's lr becomes a device tensor that train.py fills before each step, and
    its step is capturable; checkpoints hold the eager form (a float lr, capturable off), so any run resumes them;
  - lazy state made before the capture: the first WARMUP steps run eager on a side stream. They are real training
    steps (nothing is replayed twice), so the numbers are the eager step's: the graph replays its kernels.
Elsewhere than CUDA the same step runs without a graph (the CPU tests and the device check's dry run use it).
"""
import sys

import torch

from discoloop.common import ConfigError, out_of_memory

WARMUP = 3  # eager steps before the capture (the recipe's example warms up with 3)


def eager_form(opt, state):
    """An optimizer state_dict post-hook: a float learning rate and capturable off, as an eager run writes them."""
    for group in state["param_groups"]:
        group["lr"], group["capturable"] = float(group["lr"]), False
    return state


class StepGraph:
    """step(micro_batches) -> the summed loss: train.py's whole optimization step (forward, backward, clip, optimizer,
    weight average, gradients dropped) on [(x, y, loops)] device tensors, run WARMUP times eager, then captured once
    and replayed. A capture that fails (an operation the graph cannot hold) is one warning and the run goes on eager;
    out of memory is raised (train.py's advice)."""

    def __init__(self, step, optimizers, model, device, ddp=False, dtype="float32"):
        if ddp:  # DDP's all-reduce hooks and buckets are not captured here
            raise ConfigError("cuda_graph=True runs one process: allowed without torchrun (WORLD_SIZE 1), or "
                              "cuda_graph=False")
        if dtype == "float16":  # GradScaler.step reads found_inf back to the host: a sync
            raise ConfigError("cuda_graph=True with dtype float16 (this GPU's 'auto'): its loss scaling syncs every "
                              "step; allowed dtype='float32', or cuda_graph=False")
        if not all("capturable" in g for o in optimizers for g in o.param_groups):
            raise ConfigError("cuda_graph=True needs optimizer='adamw' (a capturable step that reads its lr from the "
                              "device)")
        self.step, self.optimizers, self.model, self.cuda = step, optimizers, model, str(device).startswith("cuda")
        if not self.cuda:  # the same step runs, without a graph: said once, not silent
            print(f"note: cuda_graph=True on device {str(device)!r}: a CUDA graph needs CUDA; the step it would capture "
                  "runs eagerly (the loss over every row, -1 targets masked)", file=sys.stderr)
        self.warm, self.graph, self.static, self.out = 0, None, None, None

    def __call__(self, micro_batches):
        if not self.cuda or self.graph is False:  # no CUDA, or a capture that failed: the step itself
            return self.step(micro_batches)
        if self.graph is None and self.warm < WARMUP:
            side = torch.cuda.Stream()  # the recipe's warm-up stream: lazy state made off the main one
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.step(micro_batches)
            torch.cuda.current_stream().wait_stream(side)
            self.warm += 1
            return out
        if self.graph is None and not self.capture(micro_batches):
            return self.step(micro_batches)
        for buf, new in zip(flat(self.static), flat(micro_batches)):
            buf.copy_(new, non_blocking=True)
        self.graph.replay()
        return self.out

    def capture(self, micro_batches):
        """True once the step is captured on buffers shaped like micro_batches; False (eager from now on) if it fails."""
        groups = [g for o in self.optimizers for g in o.param_groups]
        for g in groups:  # float32 on the device, where the fused kernel reads it (the eager lr rounded to float32)
            g["lr"], g["capturable"] = torch.tensor(float(g["lr"]), device=g["params"][0].device), True
        for o in self.optimizers:
            o.register_state_dict_post_hook(eager_form)
        self.static = [tuple(None if t is None else t.clone() for t in mb) for mb in micro_batches]
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        torch.cuda.synchronize()
        try:  # by hand, not torch.cuda.graph(): a capture that fails must still leave the main stream current
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    self.out = self.step(self.static)
                finally:
                    graph.capture_end()
        except Exception as e:
            if out_of_memory(e) or out_of_memory(e.__context__):
                raise
            first = e.__context__ if isinstance(e.__context__, Exception) else e  # the step's error, not the end's
            why = f"{type(first).__name__}: {(str(first).strip().splitlines() or [''])[0][:200]}"
            print(f"warning: the CUDA graph capture of the training step failed ({why}); running eager",
                  file=sys.stderr)
            for g in groups:
                g["lr"], g["capturable"] = float(g["lr"]), False
            self.model.zero_grad(set_to_none=True)
            self.graph, self.static, self.out = False, None, None
            return False
        torch.cuda.current_stream().wait_stream(side)
        self.graph = graph
        print(f"CUDA graph: the training step is captured after {WARMUP} eager steps and replayed from here on")
        return True


def flat(micro_batches):
    return [t for mb in micro_batches for t in mb if t is not None]
