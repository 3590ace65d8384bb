"""
Export a checkpoint to a Hugging Face folder that loads offline with transformers' Auto classes:

    python export_hf.py --ckpt=out/small_disco --out_dir=out/hf_small_disco
    python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained('out/hf_small_disco', trust_remote_code=True)"
    python -c "from transformers import AutoTokenizer as T; T.from_pretrained('out/hf_small_disco', trust_remote_code=False)"
    lm_eval --model hf --model_args pretrained=out/hf_small_disco,trust_remote_code=True --tasks piqa

The folder holds config.json (every GPTConfig field, an auto_map, max_position_embeddings, bos/eos and
tie_word_embeddings), model.safetensors (the weight average when the run kept one), modeling_discoloop.py
with copies of model.py, kernels.py and muon.py made now (so the folder runs the code that trained it), and a
tokenizer.json that encodes exactly as the checkpoint's tokenizer: tiktoken ranks are converted to a BPE
tokenizer.json (checked on sample texts before anything is written), a tokenizer.json is copied, a
question-answer vocabulary becomes a word-level tokenizer. Tested with the transformers version pinned in
requirements.txt.

The tokenizer needs none of the folder's code, but say so: AutoTokenizer reads config.json first, and its auto_map
makes transformers ask (y/N, 15 s) whether to run the folder's code when trust_remote_code is left unset; any
model_type transformers does not know does that. generate() runs model.py's key/value cache per (loop, layer) and
refuses, as GPT.generate does, to run past block_size; an untied head (tie_embeddings=False) is exported as its own
weight (tie_word_embeddings false).
"""
import json
import os
import shutil
import sys

import torch

from discoloop.checkpoint import load_checkpoint
from discoloop.from_checkpoint import checkpoint_tokenizer, model_from_checkpoint
from discoloop.common import ERRORS, ConfigError, DataError, die, tmp_name
from discoloop.prepare_tools import replace_folder
from configurator import FOLDER, configure
from discoloop.folder_owner import claim
from model import GPTConfig
from discoloop.tokenizer import HFEncoding, WordVocab

REPO = os.path.dirname(os.path.abspath(__file__))
# model.py's imports of this repo, as the export folder (a package under transformers' module cache) needs it
IMPORTS = {"from kernels import ": "from .kernels import ", "from muon import ": "from .muon import "}
# texts the exported tokenizer must encode exactly as the checkpoint's: spaces, digits, punctuation, non-ASCII
SAMPLES = ["Hello world", "  two  spaces, then\ttab\nand newline\n\n", "It's 1234567 o'clock; don't!",
           "naïve café — 東京 🙂", "ROMEO:\nWhat light through yonder window breaks?", " leading space", ""]


def to_hf_tokenizer(enc):
    """(tokenizers.Tokenizer with the same ids, its end-of-text token string or None), for the export."""
    if isinstance(enc, WordVocab):
        return words_to_hf(enc), None
    if isinstance(enc, HFEncoding):
        return enc.tok, enc.tok.id_to_token(enc.eot_token)
    return tiktoken_to_hf(enc), enc.decode([enc.eot_token])


def tiktoken_to_hf(enc):
    """tiktoken Encoding -> tokenizers.Tokenizer with the same ids: byte-level BPE whose merges are read off the
    ranks (as transformers' TikTokenConverter does), tiktoken's split regex, special tokens at their own ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    ranks, byte_char = enc._mergeable_ranks, bytes_to_unicode()
    as_str = lambda b: "".join(byte_char[x] for x in b)
    vocab = {as_str(t): r for t, r in ranks.items()}
    merges = []
    for t, r in ranks.items():  # every split of a token into two tokens that merge into it, by rank
        merges += sorted(((t[:i], t[i:], r) for i in range(1, len(t)) if t[:i] in ranks and t[i:] in ranks),
                         key=lambda m: (ranks[m[0]], ranks[m[1]]))
    merges = [(as_str(a), as_str(b)) for a, b, _ in sorted(merges, key=lambda m: m[2])]
    vocab.update(enc._special_tokens)  # special tokens keep their ids (cl100k_base's are not contiguous)
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))  # a whole piece in the vocab wins, as in tiktoken
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in enc._special_tokens])
    return tok


def words_to_hf(vocab):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    tok = Tokenizer(WordLevel({t: i for i, t in enumerate(vocab.vocab)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return tok


def build_tokenizer(ckpt):
    """(tokenizers.Tokenizer, eos token string or None, the checkpoint's own encoder)."""
    enc = checkpoint_tokenizer(ckpt)  # ids past the model's rows: one line, not an export that fails in transformers
    tok, eos = to_hf_tokenizer(enc)
    return tok, eos, enc


def check_tokenizer(tok, enc, samples):
    for text in samples:
        ours, theirs = tok.encode(text, add_special_tokens=False).ids, enc.encode_ordinary(text)
        if ours != theirs:
            raise DataError(f"the converted tokenizer encodes {text!r} as {ours[:8]}..., the checkpoint's as "
                            f"{theirs[:8]}...: not exported")


# what an export writes (tests/test_export.py holds it to a written folder): the only files a folder may hold for
# --overwrite=True to replace it (__pycache__: Python's, once the folder's code ran)
EXPORT_FILES = {"config.json", "model.safetensors", "modeling_discoloop.py", "model.py", "kernels.py",
                "muon.py", "tokenizer.json", "tokenizer_config.json", "__pycache__"}


def check_out_dir(out_dir, overwrite):
    """Before any work: a folder that exists is replaced only when it is empty or provably an earlier export
    (folder_owner.claim: config.json says model_type 'discoloop') holding nothing an export does not write. A run
    folder, a dataset, a Hugging Face model, '.', a file, a path under a file: one line, and nothing is touched."""
    try:
        ours = claim(out_dir, "export_hf.py")
    except DataError as e:
        raise ConfigError(str(e)) from None
    if not ours:
        return
    if not overwrite:
        raise ConfigError(f"out_dir={out_dir!r} is not empty: choose another, or pass --overwrite=True to replace "
                          "an earlier export")
    others = sorted(set(os.listdir(out_dir)) - EXPORT_FILES)
    if others:
        raise ConfigError(f"out_dir={out_dir!r} is not an earlier export (it holds {others[:3]}): --overwrite=True "
                          "replaces only a folder export_hf.py wrote; left untouched")


def make_tmp(out_dir):
    """The sibling folder the export is written into (then renamed): made now, so an out_dir that cannot be
    written fails in one line before the checkpoint is read."""
    tmp = tmp_name(out_dir)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    except OSError as e:
        raise ConfigError(f"out_dir={out_dir!r} cannot be written ({e.strerror}): choose another folder") from None
    return tmp


def export(ckpt_path, out_dir, use_ema=True, overwrite=False):
    import transformers
    from safetensors.torch import save_file
    check_out_dir(out_dir, overwrite)
    tmp = make_tmp(out_dir)  # written whole, then renamed: no half export on a crash
    try:
        return write_export(ckpt_path, out_dir, tmp, use_ema, transformers.__version__, save_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_model(model, folder, extra, save_file):
    """config.json (every GPTConfig field, the Auto classes, `extra`) and model.safetensors of a GPT into folder: the
    export's model half (the tokenizer and the code are write_export's). A head tied to the embedding is stored once
    and re-tied at load (_tied_weights_keys); an untied one is stored."""
    cfg = model.config
    config = {f: getattr(cfg, f) for f in GPTConfig.defaults()} | {
        "model_type": "discoloop", "architectures": ["DiscoLoopForCausalLM"],
        "auto_map": {"AutoConfig": "modeling_discoloop.DiscoLoopConfig",
                     "AutoModelForCausalLM": "modeling_discoloop.DiscoLoopForCausalLM"},
        "trained_n_loop": cfg.n_loop, "max_position_embeddings": cfg.block_size,
        "tie_word_embeddings": cfg.tie_embeddings, "dtype": "float32"} | extra
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    weights = {f"gpt.{k}": v.contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight" or not cfg.tie_embeddings}
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def write_export(ckpt_path, out_dir, tmp, use_ema, transformers_version, save_file):
    ckpt = load_checkpoint(ckpt_path)
    model = model_from_checkpoint(ckpt, use_ema=use_ema).eval()
    tok, eos, enc = build_tokenizer(ckpt)
    samples = SAMPLES if not isinstance(enc, WordVocab) else [" ".join(enc.vocab[:50])]
    check_tokenizer(tok, enc, samples)
    source = open(os.path.join(REPO, "model.py")).read()
    for old, new in IMPORTS.items():
        if source.count(old) != 1:
            raise ConfigError(f"model.py's import {old.strip()!r} changed: update export_hf.IMPORTS")
        source = source.replace(old, new)
    with open(os.path.join(tmp, "model.py"), "w") as f:
        f.write(source)
    for name in ("kernels.py", "muon.py"):
        shutil.copy(os.path.join(REPO, name), tmp)
    shutil.copy(os.path.join(REPO, "discoloop", "hf_modeling.py"), os.path.join(tmp, "modeling_discoloop.py"))
    cfg = model.config
    eos_id = enc.eot_token if eos is not None else None
    write_model(model, tmp, {"bos_token_id": eos_id, "eos_token_id": eos_id, "transformers_version": transformers_version,
                             "discoloop_source": {"ckpt": ckpt_path, "iter_num": ckpt.get("iter_num"),
                                                  "ema": use_ema and "ema" in ckpt}}, save_file)
    tok.save(os.path.join(tmp, "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
                  "clean_up_tokenization_spaces": False}
    if eos is not None:
        tok_config |= {"bos_token": eos, "eos_token": eos}
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=1)
    replace_folder(tmp, out_dir)  # an earlier export (check_out_dir proved it) is moved aside, then deleted
    return out_dir


DEFAULTS = dict(
    ckpt="",          # checkpoint file or run folder (required)
    out_dir="",       # the Hugging Face folder to write (required)
    use_ema=True,     # export the weight average when the run kept one (what evaluation and probes read)
    overwrite=False,  # replace a non-empty out_dir
)
CHECKS = {"out_dir": FOLDER}


def main(argv):
    try:
        c = configure(DEFAULTS, argv, __doc__, __file__, CHECKS)
        if not c["ckpt"] or not c["out_dir"]:
            raise ConfigError("--ckpt=PATH and --out_dir=DIR are required")
        with torch.no_grad():
            print(f"wrote {export(c['ckpt'], c['out_dir'], c['use_ema'], c['overwrite'])}")
    except ERRORS as e:
        die(e)


if __name__ == "__main__":
    main(sys.argv[1:])
