"""CI runs what the README tells a newcomer to run: .ci/run makes a new virtual environment, then runs the two
commands of the README's 'Install and test' block (the install, then the test command), then the two of its
'Serving' block (the serving extra's install, then its tests), verbatim."""
import os
import subprocess

from conftest import REPO


def readme_commands(section="Install and test"):
    block = open(os.path.join(REPO, "README.md")).read().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in block.splitlines() if line.startswith("    ")][:2]


def test_the_readme_block_is_the_install_and_the_suite():
    assert readme_commands() == ["pip install -r requirements.txt", "python -m pytest -q -n 2 tests"], readme_commands()


def test_ci_runs_the_readme_commands_verbatim_last():
    lines = [ln.strip() for ln in open(os.path.join(REPO, ".ci", "run")).read().splitlines()]
    assert lines[-4:] == readme_commands() + readme_commands("Serving"), lines[-4:]
    assert readme_commands("Serving")[0].startswith("pip install -r requirements-serve.txt")


def test_ci_runs_them_in_a_new_venv(tmp_path):
    # .ci/run with its two commands replaced by ones that report where they ran: it must make the venv, activate it
    # (the second command's python is the venv's) and remove it at the end
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    script = open(os.path.join(REPO, ".ci", "run")).read()
    for cmd, stand_in in zip(readme_commands() + readme_commands("Serving"), [
            "echo one > installed", "python -c \"import sys; open('tested', 'w').write(sys.prefix)\"",
            "echo two >> installed", "echo served > served"]):
        assert cmd in script
        script = script.replace(cmd, stand_in)
    (repo / ".ci" / "run").write_text(script)
    r = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (repo / "installed").read_text() == "one\ntwo\n" and (repo / "served").exists()
    prefix = (repo / "tested").read_text()
    assert prefix.endswith("venv") and not os.path.exists(prefix), prefix  # a fresh venv, removed at the end
