"""Every command README.md and docs/*.md show works as written.

Commands come from the fenced code blocks (bash, sh, shell, console or a plain fence). By how
they start:

- `edgepack ...` / `python -m packager ...`: those that need no files (`--help`, `targets`,
  `ansible-role`) run for real through CliRunner and must exit 0; every one is checked against
  the Click command: the command exists, each option is one of its options, the positional
  arguments fit and the required options are there.
- `python3 run.py ...`: the device's runner. Each option must appear in the help of the runner's
  subcommand (`python3 <runner> SUB --help`, run in a subprocess as on a device).
- `make X`: X must be a target of the Makefile (nothing is run).

Anything else (cd, ssh, pip, curl, ansible-playbook, ...) is skipped.
"""

import functools
import math
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
# The commands this file checks, by their first words; anything else in a shell block is skipped.
PREFIXES = {
    ("edgepack",): "edgepack",
    ("python", "-m", "packager"): "edgepack",
    ("python3", "-m", "packager"): "edgepack",
    ("make",): "make",
}
RUNNER_PYTHONS = {"python", "python3"}
# Commands that need no files of the user's: run for real (in an empty folder).
RUN_FOR_REAL = {
    "targets": lambda args: not any(a.endswith(".toml") for a in args),   # a built-in profile
    "ansible-role": lambda args: True,                                     # writes roles/ only
}


@functools.cache
def runner_entry() -> Path:
    """The on-device runner's entry point, as every bundle ships it: run.py and runner/ beside
    a manifest whose file table lists them (run.py's parser loads no optional module, serve's
    options among them, where no table lists it)."""
    import atexit
    import json
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="edgepack-docs-runner-"))
    atexit.register(shutil.rmtree, root, True)
    shutil.copy(ROOT / "runtimes" / "run.py", root / "run.py")
    shutil.copytree(ROOT / "runtimes" / "runner", root / "runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    files = {f"runner/{p.name}": "" for p in (root / "runner").glob("*.py")}
    (root / "manifest.json").write_text(json.dumps({"files": {"run.py": "", **files}}))
    return root / "run.py"


@dataclass(frozen=True)
class Shown:
    """One command as a doc shows it: where, and its words."""

    where: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def strip_comment(line: str) -> str:
    """*line* without a ` #` comment (a `#` inside quotes or a word stays)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_lines(path: Path):
    """(line number, command line) for each command in *path*'s shell code blocks."""
    fence, console, pending, start = None, False, "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence = stripped[3:].strip().lower()
                console = fence == "console"
            else:
                fence = None
            continue
        if fence not in SHELL_FENCES:
            continue
        text = stripped
        if not pending:
            if console and not text.startswith("$ "):
                continue   # a console block's output
            text = text.removeprefix("$ ")
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        line, pending = pending + text, ""
        line = strip_comment(line).strip()
        if line:
            yield start, line


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell *line*: split at && || ; | &, redirections dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, ""
    commands, current, skip = [], [], False
    for token in lex:
        if skip:
            skip = False
        elif token in SEPARATORS:
            commands.append(current)
            current = []
        elif token[0] in "<>":
            if current and current[-1].isdigit():
                current.pop()   # 2>&1: the 2 is the redirection's
            skip = True
        else:
            current.append(token)
    commands.append(current)
    # Leading VAR=value words set the environment; the command follows them.
    return [c[next((i for i, w in enumerate(c) if not re.match(r"\w+=", w)), len(c)):]
            for c in commands]


def kind(argv: list[str]) -> str:
    for prefix, name in PREFIXES.items():
        if tuple(argv[:len(prefix)]) == prefix:
            return name
    if len(argv) >= 2 and argv[0] in RUNNER_PYTHONS and Path(argv[1]).name == "run.py":
        return "runner"
    return "other"


def shown_commands() -> dict[str, list[Shown]]:
    found: dict[str, list[Shown]] = {"edgepack": [], "runner": [], "make": [], "other": [],
                                     "unparsed": []}
    for path in DOCS:
        for number, line in shell_lines(path):
            try:
                commands = split_commands(line)
            except ValueError:   # not shell (unbalanced quotes): fine unless it looks checked
                found["unparsed"].append(Shown(f"{path.relative_to(ROOT)}:{number}",
                                               tuple(line.split())))
                continue
            for argv in commands:
                if argv:
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found[kind(argv)].append(Shown(where, tuple(argv)))
    return found


SHOWN = shown_commands()


def edgepack_args(shown: Shown) -> list[str]:
    """The words after `edgepack` (or `python -m packager`)."""
    return list(shown.argv[1:] if shown.argv[0] == "edgepack" else shown.argv[3:])


def check_edgepack(shown: Shown, main) -> tuple[str | None, bool]:
    """Check *shown* against the Click group *main*: (the subcommand, whether it asks for help)."""
    import click

    args = edgepack_args(shown)
    root = click.Context(main, info_name="edgepack", **main.context_settings)
    group_opts = {o for p in main.get_params(root) for o in p.opts + p.secondary_opts}
    while args and args[0].startswith("-"):
        assert args[0] in group_opts, f"{shown}: {args[0]} is not an option of edgepack"
        if args[0] in root.help_option_names or args[0] == "--version":
            return None, True
        args.pop(0)
    if not args:
        return None, False
    name, rest = args[0], args[1:]
    assert name in main.commands, f"{shown}: edgepack has no command {name!r}"
    command = main.commands[name]
    ctx = click.Context(command, info_name=name, parent=root)
    options = {o: p for p in command.get_params(ctx) if isinstance(p, click.Option)
               for o in p.opts + p.secondary_opts}
    help_option = command.get_help_option(ctx)
    used, positional, asks_help = set(), [], False
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-[\d.]+", word):
            option, eq, _ = word.partition("=")
            assert option in options, f"{shown}: {option} is not an option of edgepack {name}"
            param = options[option]
            used.add(param.name)
            asks_help |= param is help_option
            if not (param.is_flag or param.count or eq):
                i += param.nargs
        else:
            positional.append(word)
        i += 1
    if asks_help:
        return name, True
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    least = sum(max(p.nargs, 1) for p in arguments if p.required)
    most = math.inf if any(p.nargs == -1 for p in arguments) else sum(p.nargs for p in arguments)
    assert least <= len(positional) <= most, (
        f"{shown}: edgepack {name} takes {least} to {most} arguments, not {positional}")
    missing = [p.opts[0] for p in options.values() if p.required and p.name not in used]
    assert not missing, f"{shown}: edgepack {name} requires {', '.join(sorted(set(missing)))}"
    return name, False


def runs_without_files(shown: Shown) -> bool:
    args = edgepack_args(shown)
    if any(a in ("-h", "--help", "--version") for a in args):
        return True
    words = [a for a in args if not a.startswith("-")]
    return not words or (words[0] in RUN_FOR_REAL and RUN_FOR_REAL[words[0]](args[1:]))


@functools.cache
def runner_text(*argv: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, str(runner_entry()), *argv], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr


@functools.cache
def runner_options(sub: str | None) -> frozenset[str]:
    """The options the runner's help lists for *sub* (None: those before the subcommand)."""
    words = [sub] if sub else []
    code, text = runner_text(*words, "--help")
    assert code == 0, text
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


@functools.cache
def runner_subcommands() -> tuple[str, ...]:
    code, text = runner_text("--help")
    assert code == 0, text
    return tuple(re.search(r"\{([\w,]+)\}", text).group(1).split(","))


def runner_parts(shown: Shown) -> tuple[list[str], str | None, list[str]]:
    """(options before the subcommand, the subcommand, the words after it)."""
    args = list(shown.argv[2:])
    before = []
    subs = runner_subcommands()
    while args and args[0] not in subs:
        before.append(args.pop(0))
    return before, (args[0] if args else None), args[1:]


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.%/ -]+?)\s*::?(?!=)", line)
        if m and not line.startswith(("\t", "#")):
            targets.update(m.group(1).split())
    return targets


def ids(items):
    return [s.where for s in items]


def test_the_docs_show_commands_of_every_checked_kind():
    counts = {k: len(v) for k, v in SHOWN.items()}
    assert counts["edgepack"] >= 20 and counts["runner"] >= 5 and counts["make"] >= 2, counts
    assert sum(runs_without_files(s) for s in SHOWN["edgepack"]) >= 3, counts


def test_every_checked_command_parses():
    for shown in SHOWN["unparsed"]:
        assert kind(list(shown.argv)) == "other", f"{shown}: unbalanced quotes"


def test_no_command_hides_outside_a_fence():
    """An indented code block is not extracted: commands belong in ``` fences."""
    for path in DOCS:
        fence = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                fence = not fence
            elif not fence and re.match(r"( {4}|\t)\s*(\$ )?(edgepack|python3? |make )", line):
                pytest.fail(f"{path.relative_to(ROOT)}:{number}: put this command in a ``` "
                            f"fence so that tests/test_docs.py checks it: {line.strip()}")


@pytest.mark.parametrize("shown", SHOWN["edgepack"], ids=ids(SHOWN["edgepack"]))
def test_edgepack_command_matches_the_cli(shown):
    from packager.cli import main

    check_edgepack(shown, main)


RUNNABLE = sorted({s.argv: s for s in SHOWN["edgepack"] if runs_without_files(s)}.values(),
                  key=lambda s: s.where)


@pytest.mark.parametrize("shown", RUNNABLE, ids=ids(RUNNABLE))
def test_edgepack_command_runs(shown, tmp_path):
    from packager.cli import main

    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        result = runner.invoke(main, edgepack_args(shown))
    assert result.exit_code == 0, f"{shown}\n{result.output}"


@pytest.mark.parametrize("shown", SHOWN["runner"], ids=ids(SHOWN["runner"]))
def test_runner_command_matches_its_help(shown):
    before, sub, after = runner_parts(shown)
    assert sub, f"{shown}: no subcommand; run.py takes one of {runner_subcommands()}"
    for words, known, where in ((before, runner_options(None), "run.py"),
                                (after, runner_options(sub), f"run.py {sub}")):
        for word in words:
            if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-[\d.]+", word):
                option = word.partition("=")[0]
                assert option in known, f"{shown}: {option} is not in `{where} --help`"


RUNNER_SUBS = sorted({runner_parts(s)[1] or "" for s in SHOWN["runner"]} - {""})
@pytest.mark.parametrize("sub", RUNNER_SUBS)
def test_runner_help_works(sub):
    code, text = runner_text(sub, "--help")
    assert code == 0 and "usage:" in text, text[-2000:]


@pytest.mark.parametrize("shown", SHOWN["make"], ids=ids(SHOWN["make"]))
def test_make_target_exists(shown):
    goals = [w for w in shown.argv[1:] if "=" not in w and not w.startswith("-")]
    assert goals, f"{shown}: no target"
    for goal in goals:
        assert goal in make_targets(), f"{shown}: the Makefile has no target {goal!r}"
