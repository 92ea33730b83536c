"""The README's commands exist after its documented set-up (it said `docker compose`, which the
set-up it points to, deploy/ci-docker.sh, does not install: that installs `docker-compose`):
every `dekube-node` command line names a real subcommand, every repository script it runs exists,
compose goes through deploy/compose.sh, and deploy/compose.sh runs whichever compose is installed."""
import os
import stat
import subprocess
from pathlib import Path

import pytest

from cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def command_lines() -> list[tuple[int, list[str]]]:
    """(line number, words) of each command in the README's indented blocks (first word lower-case, no
    Python), with `sudo` dropped."""
    out = []
    lines = README.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.startswith("    ") or not line.strip() or line.startswith("     "):
            continue
        words = line.split("#")[0].split()
        if words and words[0] == "sudo":
            words = words[1:]
        if words:
            out.append((number, words))
    return out


def test_dekube_node_lines_name_real_subcommands():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    seen = 0
    for number, words in command_lines():
        if words[0] != "dekube-node":
            continue
        seen += 1
        assert words[1] in commands, f"README line {number}: no `dekube-node {words[1]}`"
        sub = commands[words[1]]
        actions = [a for a in sub._actions if a.choices and isinstance(a.choices, dict)]
        if actions and not words[2].startswith("-"):
            for action in words[2].split("|"):
                assert action in actions[0].choices, f"README line {number}: no `dekube-node {words[1]} {action}`"
    assert seen > 20


def test_scripts_the_readme_runs_exist_and_compose_goes_through_the_wrapper():
    for number, words in command_lines():
        script = words[1] if words[0] == "bash" else words[0]
        if script.startswith(("scripts/", "deploy/")) and not script.endswith("/"):
            path = REPO / script
            assert path.is_file(), f"README line {number}: {script} does not exist"
            assert words[0] == "bash" or path.stat().st_mode & stat.S_IXUSR, f"README line {number}: not executable"
        assert words[0] != "docker-compose" and words[:2] != ["docker", "compose"], \
            f"README line {number}: compose is run as deploy/compose.sh (the set-up may install either form)"


def fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("plugin", [True, False])
def test_compose_wrapper_uses_the_plugin_or_the_standalone_command(tmp_path, plugin):
    log = tmp_path / "calls"
    fake_bin(tmp_path, "docker", f'if [ "$1 $2" = "compose version" ]; then exit {0 if plugin else 1}; fi\n'
                                 f'echo "docker $*" >> {log}')
    fake_bin(tmp_path, "docker-compose", f'echo "docker-compose $*" >> {log}')
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    run = subprocess.run([str(REPO / "deploy" / "compose.sh"), "up", "-d"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, run.stderr
    compose = "docker compose" if plugin else "docker-compose"
    assert log.read_text().strip() == f"{compose} -f {REPO / 'deploy' / 'docker-compose.yml'} up -d"


def test_compose_wrapper_without_compose_says_what_to_install(tmp_path):
    fake_bin(tmp_path, "docker", "exit 1")
    (tmp_path / "dirname").symlink_to(subprocess.run(["sh", "-c", "command -v dirname"], capture_output=True,
                                                     text=True).stdout.strip())
    run = subprocess.run(["/bin/bash", str(REPO / "deploy" / "compose.sh"), "ps"],
                         env={**os.environ, "PATH": str(tmp_path)}, capture_output=True, text=True, timeout=30)
    assert run.returncode == 127 and "deploy/ci-docker.sh" in run.stderr
