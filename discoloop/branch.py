"""
init_from=<folder>: a new run that starts from another's weights (a run folder, a checkpoint, or a Hugging Face folder
converted by pretrained.py). Apart from checkpoint.py so that what opens a checkpoint (from_checkpoint.py, bench.py,
lab/) does not stand on the Hugging Face converter: only train.py's branch does.
"""
import os
import sys

from configurator import COMMAND_LINE
from discoloop.checkpoint import load_checkpoint
from discoloop.common import CheckpointError
from discoloop.folder_owner import hf_folder
from model import ARCH_KEYS, CONTINUE_KEYS, GPTConfig


def load_branch(path, config, stated=()):
    """init_from=<folder>: the starting weights of a new run, with its own optimizer and schedule (a resume stays
    strict). A run folder or checkpoint file gives its weights (and its weight average); a Hugging Face folder gives
    pretrained.from_pretrained's: the folder decides the architecture (model.ARCH_KEYS: a config file's value
    is replaced, one line each; one typed on the command line, `stated`, at another value is refused naming both),
    the config the rest (CONTINUE_KEYS: the recurrence, the window, ...). Returns (model state, weight-average state or None, {model key: value} the
    config must take, facts for config.json)."""
    if hf_folder(path):
        from discoloop.pretrained import from_pretrained, pretrained_architecture  # only a branch from a folder converts one
        stated = stated if isinstance(stated, dict) else dict.fromkeys(stated, COMMAND_LINE)
        typed = {k for k, where in stated.items() if where == COMMAND_LINE}  # a conflict the user typed is refused
        keys = {k: config[k] for k in config if k in CONTINUE_KEYS or (k in ARCH_KEYS and k in typed)}
        try:
            kind = pretrained_architecture(path)[0]
            model = from_pretrained(path, **keys)
        except ValueError as e:  # the folder's one-line errors, a conflict, a recurrence key it cannot take
            raise CheckpointError(f"init_from={path!r}: {e}") from None
        args = {f: getattr(model.config, f) for f in GPTConfig.defaults()}
        replaced = {k: [config[k], args[k]] for k in ARCH_KEYS if k in stated and k not in typed and config[k] != args[k]}
        for k, (was, now) in replaced.items():  # nanoGPT's init_from: the pretrained architecture over a config file's
            print(f"note: {k}={now!r} from {path} replaces {k}={was!r} of {stated[k]} (the folder decides its "
                  "architecture)", file=sys.stderr)
        return model.state_dict(), None, args, {"init_from": path, "init_kind": f"Hugging Face {kind}",
                                                "init_fresh": model.pretrained_fresh, "init_replaced": replaced}
    if not os.path.exists(path):
        raise CheckpointError(f"init_from={path!r} is not 'scratch', 'resume', a run folder, a checkpoint or a Hugging "
                              "Face model folder: nothing there")
    ckpt = load_checkpoint(path)
    return (ckpt["model"], ckpt.get("ema"), {},
            {"init_from": path, "init_kind": "run", "init_iter": ckpt.get("iter_num"),
             "init_changed": {k: [v, config[k]] for k, v in ckpt.get("config", {}).items()
                              if k in config and config[k] != v and k not in ("out_dir", "init_from", "overwrite")}})


def load_branch_weights(model, state, path):
    """Load a branch's weights into the new run's model: every source weight needs a home of its shape; weights the
    source lacks (a recurrence's new gate or injection norm) start fresh and are named. One-line CheckpointError."""
    want = model.state_dict()
    bad = [k for k, v in state.items() if k not in want or want[k].shape != v.shape]
    if bad:
        raise CheckpointError(f"init_from={path!r}: its weight {bad[0]} has no place of that shape in this model "
                              f"({len(bad)} such); the model keys must describe the same stack")
    missing, _ = model.load_state_dict(state, strict=False)
    return [m for m in missing if not (m == "lm_head.weight" and model.config.tie_embeddings)]


