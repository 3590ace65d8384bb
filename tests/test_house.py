"""The house's layering, read from the source: no import cycle among the project's modules, model.py (with
kernels.py) stands alone for a forker to copy, common.py imports nothing of the project, and a project module is
imported inside a function only where that saves a heavy third-party import (the line says so)."""
import ast
import glob
import os
import subprocess
import sys

from conftest import REPO

MODULES = {os.path.splitext(os.path.basename(p))[0]: p for p in glob.glob(os.path.join(REPO, "*.py"))}
SCRIPTS = {f"data.{os.path.basename(os.path.dirname(p))}.{os.path.splitext(os.path.basename(p))[0]}": p
           for p in glob.glob(os.path.join(REPO, "data", "*", "*.py"))}
PROJECT = {**MODULES, **SCRIPTS}


def imports(path):
    """[(module, lineno, at top level?)] of the project modules a file imports."""
    tree = ast.parse(open(path).read())
    top = set(id(n) for n in tree.body)
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in PROJECT:
                out.append((name, node.lineno, id(node) in top))
    return out


def graph():
    return {m: {n for n, _, _ in imports(p)} - {m} for m, p in PROJECT.items() if m != "modeling_discoloop"}


def test_no_import_cycle():
    g, state, cycle = graph(), {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(g.get(m, ())):
            if state.get(n) == "open":
                cycle.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"
    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycle, f"import cycle: {' -> '.join(cycle[0])}"


def test_model_and_common_stand_low():
    g = graph()
    assert g["model"] <= {"kernels", "muon"}, f"model.py imports {sorted(g['model'])}: a forker copies model.py + kernels.py"
    assert not g["common"] and not g["kernels"] and not g["compat"], "common.py, kernels.py, compat.py import nothing of ours"


def test_model_py_runs_copied_alone(tmp_path):
    for name in ("model.py", "kernels.py", "muon.py"):
        (tmp_path / name).write_text(open(os.path.join(REPO, name)).read())
    code = ("import torch; from model import GPT, GPTConfig; m = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, "
            "n_embd=16, block_size=8, recurrence='disco', n_loop=2)); x = torch.randint(0, 50, (2, 8)); "
            "print(m(x, x)[1].item() > 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


def test_function_level_project_imports_say_why():
    for m, path in PROJECT.items():
        lines = open(path).read().splitlines()
        for name, lineno, top in imports(path):
            if not top and not name.startswith("data."):  # data.<name>.prepare: the dataset dispatch (dataloader.py)
                assert "#" in lines[lineno - 1], f"{m}.py:{lineno} imports {name} inside a function without saying why"


def test_no_function_over_sixty_lines():
    long = [f"{os.path.relpath(p, REPO)}:{n.name} ({n.end_lineno - n.lineno + 1})" for p in PROJECT.values()
            for n in ast.walk(ast.parse(open(p).read()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"functions over 60 lines: {long}"


# growth is a decision: raising one of these is a line in a reviewed change, not drift. kernels.py holds the core's Phi
# kernels only (candidates live in lab/), bench.py measures (the lab compares alternatives). model.py 600 -> 640: the
# adaptive exit beside the loop (issue 55)
LINE_BUDGETS = {"model.py": 640,
                "train.py": 430, "README.md": 200, "kernels.py": 200, "bench.py": 550}
# lines of project code train.py imports, directly or through others (its import closure): raising it is a decision too.
# Issue 57's 4,146, the adaptive exit inside it: what only the scripts that use a checkpoint need is inference.py, what
# only prepare scripts need is dataprep.py, the Hugging Face tokenizer conversion is export_hf.py's; training imports none
TRAIN_CLOSURE_BUDGET = 4146


def test_train_import_closure_budget():
    g, seen, todo = graph(), set(), ["train"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [n for n in g.get(m, ()) if n in PROJECT]
    lines = sum(len(open(PROJECT[m]).read().splitlines()) for m in seen)
    assert lines <= TRAIN_CLOSURE_BUDGET, f"train.py imports {lines} lines of project code over {sorted(seen)}"


def test_line_budgets():
    over = {name: n for name, limit in LINE_BUDGETS.items()
            if (n := len(open(os.path.join(REPO, name)).read().splitlines())) > limit}
    assert not over, f"over their line budgets {LINE_BUDGETS}: {over}"


def test_the_key_file_is_only_keys_and_train_stands_on_five_floors():
    """train_config.py (the keys) imports neither the Hugging Face loader nor the tokenizer (the data checks live in
    dataloader.py, beside open_data); the longest chain of project imports under train.py is five modules."""
    g = graph()
    assert not {"pretrained", "tokenizer", "dataloader", "tasks", "shards"} & g["train_config"], sorted(g["train_config"])

    def depth(m, seen=()):
        return 1 + max((depth(n, seen + (m,)) for n in g.get(m, ()) if n in g and n not in seen), default=0)
    assert depth("train") <= 5, f"train.py stands on {depth('train')} floors of imports"
