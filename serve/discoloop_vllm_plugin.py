"""vLLM's entry point into this repo (serve/pyproject.toml, installed editable): in each process vLLM starts, the repo
beside this folder joins sys.path (last: it shadows nothing) and discoloop/vllm_model.py registers the export's
config and model classes."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def register():
    if REPO not in sys.path:
        sys.path.append(REPO)
    from discoloop.vllm_model import register as register_model
    register_model()
