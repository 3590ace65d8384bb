"""
Sample from a trained model (nanoGPT's sample.py), with a key/value cache per (loop, layer):

    python sample.py --ckpt=out/small_disco --start="ROMEO:" --num_samples=3 --max_new_tokens=200
    python sample.py --ckpt=out/small_disco --start=FILE:prompt.txt --temperature=0.6 --top_k=40 --n_loop=6
    python sample.py --ckpt=out/small_disco --exit_rule=prob --exit_threshold=0.5     # adaptive depth (model.Exit)
    python sample.py --ckpt=out/small_disco --speculative_draft_loops=1   # exact self-speculative (speculative.py)

The tokenizer is the checkpoint's (tiktoken, bytes or tokenizer.json for token shards; the vocabulary's
words for a question-answer folder). The same --seed gives the same samples, with or without the cache; speculative
decoding gives greedy's very tokens, and samples from the same distribution (not the same samples for a seed).
"""
import sys

import torch

from discoloop import from_checkpoint
from discoloop import speculative
from discoloop.checkpoint import load_checkpoint
from discoloop.from_checkpoint import (EXIT_CHECKS, EXIT_KEYS, KV_CHECKS, KV_KEYS, checkpoint_tokenizer, exit_option,
                                      kv_override, model_from_checkpoint)
from discoloop.common import ERRORS, SYSTEM_CHECKS, ConfigError, autocast, die, setup
from configurator import INT_GE0, INT_GE1, check_inert, configure, num
from discoloop.precision import resolve_dtype
from discoloop.speculative import SPEC_CHECKS, SPEC_KEYS, spec_option

DEFAULTS = dict(
    ckpt="",             # checkpoint file or run folder
    start="\n",          # the prompt, or FILE:path to read it from a file
    num_samples=3,       # samples to draw
    max_new_tokens=200,  # tokens per sample (prompt + these must fit in block_size)
    temperature=0.8,     # 1.0 = the model's distribution, lower = more conservative, 0 = greedy
    top_k=200,           # sample among the k likeliest tokens only (0 = all)
    seed=1337,           # seed of the sampling
    n_loop=0,            # loops to run (0 = the trained K)
    use_cache=True,      # reuse keys and values per (loop, layer); False reruns the whole prefix every token
    raw=False,           # sample from the raw weights, not the weight average (EMA)
    threads=0,           # CPU threads (0 = torch's choice)
    device="auto",       # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="float32",     # 'float32' | 'bfloat16' | 'auto'
    **KV_KEYS,
    **EXIT_KEYS,
    **SPEC_KEYS,
)
# when a key acts (configurator.check_inert, train.py's rule: a typed key that would do nothing is refused)
ACTIVE = {k: (lambda c: c["temperature"] > 0, "temperature > 0 (temperature 0 takes the top token)") for k in ("top_k", "seed")}
CHECKS = {**SYSTEM_CHECKS, "num_samples": INT_GE1, "max_new_tokens": INT_GE1, "top_k": INT_GE0, "n_loop": INT_GE0,
          "temperature": num(0), **KV_CHECKS, **EXIT_CHECKS, **SPEC_CHECKS}


def read_prompt(start):
    """The prompt text: `start` itself, or the UTF-8 text of the file named by FILE:path (a one-line ConfigError
    naming the file when it cannot be read or is not UTF-8 text)."""
    if not start.startswith("FILE:"):
        return start
    path = start[5:]
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(f"start='FILE:{path}': the file is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} "
                          f"at offset {e.start}): save the prompt as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"start='FILE:{path}': the file cannot be read ({e.strerror})") from None


def main(argv):
    try:
        stated = {}
        c = configure(DEFAULTS, argv, __doc__, [__file__, from_checkpoint.__file__, speculative.__file__], CHECKS, stated)
        check_inert(c, DEFAULTS, ACTIVE, stated)
        if not c["ckpt"]:
            raise ConfigError("--ckpt=PATH is required (a checkpoint file or run folder)")
        start = read_prompt(c["start"])  # before any work: a bad prompt file is one line
        device = setup(c["device"], c["threads"])
        ckpt = load_checkpoint(c["ckpt"])
        enc = checkpoint_tokenizer(ckpt, c["ckpt"])  # a tokenizer with ids the model has no row for: one line
        model = model_from_checkpoint(ckpt, use_ema=not c["raw"], **kv_override(c["kv_share"], c["use_cache"]))
        model = model.to(device).eval()
        exits = exit_option(c["exit_rule"], c["exit_threshold"], c["exit_min_loops"], model, c["n_loop"] or None,
                            c["ckpt"])  # 'gate': the gate trained beside the checkpoint
        spec = spec_option(c["speculative_draft_loops"], c["speculative_len"], model, c["n_loop"] or None, exits,
                           c["use_cache"], c["speculative_propose"], c["speculative_recheck"])
        ids = enc.encode_ordinary(start) or ([enc.eot_token] if enc.eot_token is not None else [])
        if not ids:
            raise ConfigError(f"start={c['start']!r} gives no token and the tokenizer has no end-of-text token: "
                              "give a prompt")
        x = torch.tensor([ids], device=device)
        torch.manual_seed(c["seed"])
        gen = torch.Generator(device=device).manual_seed(c["seed"])
        with autocast(device, resolve_dtype(c["dtype"], device)):
            for _ in range(c["num_samples"]):
                kw = dict(temperature=c["temperature"], top_k=c["top_k"] or None, n_loop=c["n_loop"] or None,
                          generator=gen, n_vocab=enc.n_vocab)  # rows past the tokenizer's ids pad the vocabulary
                y = (speculative.generate(model, x, c["max_new_tokens"], spec, **kw) if spec else
                     model.generate(x, c["max_new_tokens"], use_cache=c["use_cache"], exits=exits, **kw))
                print(enc.decode(y[0].tolist()))
                print("---------------")
        if exits is not None:  # on stderr: stdout stays the samples
            loops, K = torch.cat([t.flatten() for t in exits.loops]).float(), c["n_loop"] or model.config.n_loop
            print(f"adaptive depth ({exits.rule} {exits.threshold:g}): {loops.mean():.3f} loops per token of {K} "
                  f"over {loops.numel()} token passes, {1 - loops.mean() / K:.1%} of the looped blocks saved", file=sys.stderr)
        if spec is not None:
            print(spec.summary(), file=sys.stderr)
    except (*ERRORS, ValueError, OSError) as e:
        die(e if not isinstance(e, OSError) else f"{getattr(e, 'filename', '')}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
