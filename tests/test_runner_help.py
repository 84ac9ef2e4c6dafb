"""Every command of a built bundle's run.py answers --help (exit 0, a usage line), read from the
runner's own list of commands so that a new command is covered without editing this test."""

import re

from conftest import run_py


def test_every_run_py_command_answers_help(built):
    bundle = built.bundle.directory
    top = run_py(bundle, "--help")
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: run.py"), top.stdout[:200]
    commands = re.search(r"\{([a-z,-]+)\}", top.stdout).group(1).split(",")
    assert {"check", "bench", "infer", "serve"} <= set(commands), commands
    for command in commands:
        r = run_py(bundle, command, "--help")
        assert r.returncode == 0, f"run.py {command} --help: exit {r.returncode}: {r.stderr[-2000:]}"
        assert r.stdout.startswith(f"usage: run.py {command}"), r.stdout[:200]
        assert "Traceback" not in r.stderr
        assert "--help" in r.stdout
