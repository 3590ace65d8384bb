"""
The synthetic natural-language two-hop task (paper Sec. 5.2): the symbolic two-graph data
(data/symbolic/prepare.py builds the graphs and splits) verbalized in English,

    atom     " Finley's teacher is" -> " Anya"
    direct   " Finley's teacher's wife is" -> " Charlie"
    reverse  " Who is the wife of the teacher of Finley?\nAnswer:" -> " Charlie"

tokenized with GPT-2 BPE through tiktoken and remapped to the compact vocabulary of the token ids
that occur (a small model does not pay for 50,257 embedding rows). meta.json keeps the map
(`bpe_ids`: compact id -> GPT-2 id) so every example decodes back to its sentence. By default names
are one-token census names and every sentence starts with a space (see NAME_SOURCES below), so each
entity is one token wherever it stands; --names=syllable gives names of several tokens.

    python data/nl/prepare.py --format=direct --tiktoken_file=PATH/gpt2.tiktoken
    python data/nl/prepare.py --format=reverse --out_dir=data/nl/reverse --tiktoken_file=PATH/gpt2.tiktoken

Offline: tiktoken.get_encoding("gpt2") downloads its ranks; where it cannot, the official file is taken
out of the openai-whisper sdist on the package index (tokenizer.gpt2_ranks_file, hash checked), or
--tiktoken_file reads one from disk. Split files hold question tokens, a tab,
then the answer tokens (a name may span several BPE tokens; loss and exact match cover all).
"""
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop import tokenizer  # noqa: E402
from discoloop.common import ConfigError  # noqa: E402
from configurator import one_of  # noqa: E402
from discoloop.prepare_tools import cli, prepare_and_say, prepare_qa  # noqa: E402
from data.symbolic import prepare as sym  # noqa: E402  (the graph code, reused)

ON_FIRST_USE = True  # train.py prepares this folder when it starts (a few seconds)
DEFAULTS = {**sym.DEFAULTS,
            "out_dir": os.path.join(REPO, "data", "nl", "direct"),  # folder to write
            "format": "direct",      # 'direct' ("a's r1's r2 is") or 'reverse' ("the r2 of the r1 of a is")
            "names": "census",       # entity names: 'census' (one-token real names), 'census_strict', 'syllable'
            "leading_space": True,   # every sentence starts with a space, so a name is one token everywhere
            "encoding": "gpt2",      # tiktoken encoding of the sentences
            "tiktoken_file": ""}     # a local GPT-2 ranks file (default: tiktoken's, else fetched from the package index)
GENERATOR_KEYS = sym.GENERATOR_KEYS + ["format", "names", "leading_space", "encoding"]
FORMATS = ("direct", "reverse")
# census: real first names and surnames (US Census 1990 lists, public domain; names.txt, most common
#   first) that are ONE token after a space, so every answer and injected bridge is a single token
#   (without leading_space, a subject at the start of a sentence may still take two or more).
# census_strict: one token in both places (what a sentence-initial name needs without leading_space).
# syllable: generated names of 1-6 tokens. The README measures which of these train.
# leading_space: every sentence starts with a space (as SentencePiece tokenizers, e.g. Llama's and
#   DeepSeek's, add one), so a name is the SAME token as subject and as answer. GPT-2 BPE otherwise
#   splits "Kit's" and " Kit" into different tokens, and the OOD graph's bridges -- seen as answers
#   only -- are never linked to the facts stored under their subject token (README: OOD stays 0).
NAME_SOURCES = ("census", "census_strict", "syllable")
NAMES_FILE = os.path.join(REPO, "data", "nl", "names.txt")

RELATIONS = """teacher wife husband mother father sister brother friend boss neighbor doctor dentist lawyer
coach mentor student partner cousin uncle aunt nephew niece son daughter grandmother grandfather roommate
landlord tenant assistant manager colleague classmate tutor therapist accountant surgeon editor agent trainer
rival supervisor chef driver secretary advisor sponsor nurse banker employer""".split()
# checked before any work: a bad format, names or n_relations used to be refused only after GPT-2's ranks were fetched
CHECKS = {**sym.CHECKS, "format": one_of(*FORMATS), "names": one_of(*NAME_SOURCES),
          "n_relations": (lambda v: 1 <= v <= len(RELATIONS), f"1..{len(RELATIONS)} (one relation noun each)")}

ONSETS = ["B", "C", "D", "F", "G", "H", "J", "K", "L", "M", "N", "P", "R", "S", "T", "V", "W", "Z", "Br", "Ch",
          "Cl", "Dr", "El", "Fl", "Gr", "Kr", "Pr", "St", "Tr", "Sh", "Th", "Al", "An", "Ar", "Ed", "Em", "Is", "Or"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"]
CODAS = ["n", "l", "r", "s", "th", "x", "nd", "rk", "lla", "na", "ra", "ria", "nne", "lie", "son", "ton", "ley",
         "den", "bel", "mir", "zel", "dra", "ven", "nor"]


def make_names(n, seed):
    """n distinct capitalized names, none a prefix of another (so no answer is a prefix of another)."""
    rng = np.random.default_rng([seed, 7])
    names = set()
    while len(names) < 4 * n:
        names.add(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) +
                  (rng.choice(VOWELS) + rng.choice(CODAS) if rng.random() < 0.5 else ""))
    ordered = sorted(names)
    keep = [a for a, b in zip(ordered, ordered[1:] + [""]) if not b.startswith(a)]  # sorted: prefixes are adjacent
    if len(keep) < n:
        raise ConfigError(f"could not generate {n} distinct names (asked for n_entities={n // 2} per graph)")
    rng.shuffle(keep)
    return keep[:n]


def read_names():
    """names.txt without its comment lines, most common first."""
    with open(NAMES_FILE) as f:
        return [w.strip() for w in f if w.strip() and not w.startswith("#")]


def census_names(n, seed, enc, strict):
    """The n most common census names that are one token after a space (and sentence-initially
    if strict), in a seeded random order. "Ann" and "Anna" may both occur: as answers they are two
    distinct single tokens, so neither answer is a prefix of the other (what exact match needs)."""
    one = [w for w in read_names() if len(enc.encode_ordinary(" " + w)) == 1 and (not strict or len(enc.encode_ordinary(w)) == 1)]
    if len(one) < n:
        raise ConfigError(f"only {len(one)} names in {os.path.relpath(NAMES_FILE, REPO)} are one '{enc.name}' token, "
                          f"{n} needed (n_entities={n // 2} per graph): use a smaller graph or --names=syllable")
    keep = one[:n]
    np.random.default_rng([seed, 7]).shuffle(keep)
    return keep


def verbalize(ex, fmt, name, rel, lead=" "):
    """(question, answer) strings of one symbolic example (entity, relations..., answer); `lead`
    starts the question (" " with leading_space, else "")."""
    a, rels, ans = name[ex[0]], [rel[r] for r in ex[1:-1]], " " + name[ex[-1]]
    if len(rels) == 1 or fmt == "direct":  # atoms always read "X's r is"
        return f"{lead}{a}'s " + "'s ".join(rels) + " is", ans
    chain = " of the ".join(reversed(rels))  # (a, r1, r2) -> the r2 of the r1 of a
    return f"{lead}Who is the {chain} of {a}?\nAnswer:", ans


def build(c, enc):
    if c["format"] not in FORMATS:
        raise ConfigError(f"format={c['format']!r} is invalid: allowed {FORMATS}")
    if c["names"] not in NAME_SOURCES:
        raise ConfigError(f"names={c['names']!r} is invalid: allowed {NAME_SOURCES}")
    if c["n_relations"] > len(RELATIONS):
        raise ConfigError(f"n_relations={c['n_relations']} exceeds the {len(RELATIONS)} relation nouns")
    splits, meta, _ = sym.build(c)
    ents = meta["entities"]["A"] + meta["entities"]["B"]
    if c["names"] == "syllable":
        names = make_names(len(ents), c["seed"])
    else:
        names = census_names(len(ents), c["seed"], enc, strict=c["names"] == "census_strict")
    name = dict(zip(ents, names))
    rel = dict(zip(meta["relations"], RELATIONS))
    lead = " " if c["leading_space"] else ""
    texts = {s: [verbalize(ex, c["format"], name, rel, lead) for ex in exs] for s, exs in splits.items()}
    encoded = {s: [(enc.encode_ordinary(q), enc.encode_ordinary(a)) for q, a in pairs] for s, pairs in texts.items()}
    bpe_ids = sorted({t for pairs in encoded.values() for q, a in pairs for t in q + a})
    compact = {t: i for i, t in enumerate(bpe_ids)}
    vocab = [f"t{t}" for t in bpe_ids]  # token strings of the split files
    name_toks = {t for n in name.values() for t in enc.encode_ordinary(" " + n) + enc.encode_ordinary(n)}
    rel_toks = {t for r in rel.values() for t in enc.encode_ordinary(" " + r)}
    kinds = {f"t{t}": "entity" if t in name_toks else "relation" if t in rel_toks else "filler" for t in bpe_ids}
    files = {f"{s}.txt": "".join(" ".join(vocab[compact[t]] for t in q) + "\t" + " ".join(vocab[compact[t]] for t in a)
                                 + "\n" for q, a in pairs) for s, pairs in encoded.items()}
    files.update({f"{s}.text.jsonl": "".join(json.dumps({"question": q, "answer": a, "example": ex}) + "\n"
                                         for (q, a), ex in zip(pairs, splits[s])) for s, pairs in texts.items()})
    meta.update(vocab=vocab, bpe_ids=bpe_ids, encoding=enc.name, token_kinds=kinds,
                names={e: name[e] for e in ents}, relation_words=rel,
                config={k: c[k] for k in GENERATOR_KEYS})
    return files, meta


def prepare(c, enc=None):
    """The symbolic dataset of config c, in English, into c['out_dir'] (prepare_tools.prepare_qa: kept when it is this
    config's; GPT-2's ranks are fetched only where the folder is made)."""
    sym.check_config(c)
    tok = {"encoding": c["encoding"], "tiktoken_file": c["tiktoken_file"]}
    return prepare_qa(c, "nl", GENERATOR_KEYS, lambda c: build(c, enc or tokenizer.get_encoding(tok)))


def main(argv):
    c, (verb, out) = cli(lambda c: prepare_and_say(prepare, c),
                         DEFAULTS, argv, __doc__, [__file__, os.path.join(REPO, "data", "symbolic", "prepare.py")], CHECKS)
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(out, "test_ood.text.jsonl")) as f:
        ex = json.loads(f.readline())
    print(f"{verb} {out}: vocabulary of {len(meta['vocab'])} GPT-2 tokens; e.g. {ex['question']!r} ->{ex['answer']!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
