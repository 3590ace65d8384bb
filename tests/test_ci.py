"""CI runs what the README tells a newcomer to run: .ci/run reads the two commands of the README's 'Install and test'
block (the install, then the test command) and runs them in a new virtual environment."""
import os
import subprocess

from conftest import REPO


def test_ci_runs_the_readme_commands_in_a_new_venv(tmp_path):
    # a stand-in README whose two commands only say they ran, and a stand-in python3 whose venv is a real one: .ci/run
    # must make the venv, activate it and run both commands in order, through the README's own words
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / ".ci" / "run").write_text(open(os.path.join(REPO, ".ci", "run")).read())
    (repo / "README.md").write_text("# x\n\n## Install and test\n\n    echo one > installed\n"
                                    "    python -c \"import sys; open('tested', 'w').write(sys.prefix)\"\n\n## Quickstart\n\n"
                                    "    echo never > quickstart\n")
    r = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (repo / "installed").read_text() == "one\n" and not (repo / "quickstart").exists()
    prefix = (repo / "tested").read_text()
    assert prefix.endswith("venv") and not os.path.exists(prefix), prefix  # a fresh venv, removed at the end


def test_ci_refuses_a_readme_without_two_commands(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / ".ci" / "run").write_text(open(os.path.join(REPO, ".ci", "run")).read())
    (repo / "README.md").write_text("# x\n\n## Install and test\n\n    echo one\n\n## Quickstart\n")
    r = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "exactly 2" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_readme_block_is_the_install_and_the_suite():
    block = open(os.path.join(REPO, "README.md")).read().split("## Install and test", 1)[1].split("\n## ", 1)[0]
    cmds = [line.strip() for line in block.splitlines() if line.startswith("    ")]
    assert cmds == ["pip install -r requirements.txt", "python -m pytest -q -n 2 tests"], cmds
