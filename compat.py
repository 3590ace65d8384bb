"""
Back-compat in one place: what older config files, command lines and checkpoints said, read as today's. Every reader
of those (configurator.py for config files and command lines, checkpoint.load_checkpoint for checkpoints) goes
through here, so retiring an old form is one deletion in this file.
"""

# keys renamed since: Phi's settings drive PonderLM as well as DiscoLoop, so they are not called disco_*
RENAMED = {"disco_tau": "phi_tau", "disco_topk": "phi_topk", "disco_chunk": "phi_chunk"}


def renamed(d):
    """d with every old key name replaced by its new one."""
    return {RENAMED.get(k, k): v for k, v in d.items()}


def upgrade_checkpoint(ckpt):
    """A loaded checkpoint (a dict) in today's form: renamed keys in its model_args and config, the precision it was
    trained in as 'dtype_resolved' (it was 'dtype', the name of the key that asks for one), and weight names without
    the '_orig_mod.' prefix that a whole-model torch.compile gave them before compile went per block."""
    if "dtype" in ckpt and "dtype_resolved" not in ckpt:
        ckpt["dtype_resolved"] = ckpt.pop("dtype")
    for key in ("model_args", "config"):
        if isinstance(ckpt.get(key), dict):
            ckpt[key] = renamed(ckpt[key])
    for key in ("model", "ema"):
        if isinstance(ckpt.get(key), dict):
            ckpt[key] = {k.removeprefix("_orig_mod."): v for k, v in ckpt[key].items()}
    return ckpt
