"""The library under the scripts at the root: imported explicitly (`from discoloop.common import die`,
`from discoloop import plots`); model.py, kernels.py and muon.py stay at the root, a forker's copy."""
