"""Shell completion and --version: the candidates (commands, options, runbook names,
``key=`` parameters, node names from the inventory, choices) asked in this process, and the
bash and zsh scripts loaded into a real shell that asks the real program."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from bot.surfaces import cli, completion

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A configuration with an inventory of three nodes and the shipped runbooks; a
    ``runbook`` on PATH that is this checkout's."""
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump({
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "inventory": {"nodes": ["gpu01", "gpu02", "hx1"], "discover": False},
    }))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "runbook"
    program.write_text(f'#!/bin/sh\nexec {sys.executable} -m bot "$@"\n')
    program.chmod(0o755)
    found = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    found.update(RUNBOOK_CONFIG=str(tmp_path / "bot.yaml"),
                 PATH=f"{bin_dir}:{found.get('PATH', '')}", PYTHONPATH=str(ROOT))
    return found


def ask(words: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("RUNBOOK_CONFIG", env["RUNBOOK_CONFIG"])
    return completion.candidates(cli._parser(), words)


@pytest.mark.parametrize(("words", "expected"), [
    (["pl"], ["plan"]),
    (["--"], ["--config", "--help", "--version"]),
    (["describe", "drain-no"], ["drain-node", "drain-nodes"]),
    (["plan", "drain-node", ""], ["change=", "min_free_gpus=", "node=", "reason=", "requeue=",
                                  "timeout="]),
    (["run", "drain-node", "node=gpu01", "re"], ["reason=", "requeue="]),
    (["plan", "drain-node", "node=g"], ["node=gpu01", "node=gpu02"]),
    (["plan", "drain-node", "requeue="], ["requeue=false", "requeue=true"]),
    (["plan", "reset-gpu", "method="], ["method=reboot", "method=reset"]),
    (["node", ""], ["gpu01", "gpu02", "hx1"]),
    (["history", "--node", "h"], ["hx1"]),
    (["history", "--runbook", "resume-n"], ["resume-node", "resume-nodes"]),
    (["history", "--l"], ["--limit"]),
    (["breaker", ""], ["reset", "status"]),
    (["audit", "v"], ["verify"]),
    (["audit", "verify", "--ch"], ["--checkpoints"]),
    (["schedule", "add", "selft"], ["selftest"]),
    (["schedule", "add", "selftest", "c"], ["change=", "cron="]),
    (["window", "create", "gpu0"], ["gpu01", "gpu02"]),
    (["schema", ""], ["config", "runbook"]),
])
def test_candidates(words: list[str], expected: list[str], env: dict[str, str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert ask(words, env, monkeypatch) == expected


def test_a_broken_configuration_gives_no_candidates_and_no_noise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("inventory: {nodez: [gpu01]}\n")
    found: list[str] = []
    completion.answer(cli._parser(), ["--config", str(tmp_path / "bad.yaml"), "node", ""],
                      found.append)
    assert found == [] and capsys.readouterr() == ("", "")


def test_bash_cuts_candidates_at_its_word_breaks() -> None:
    assert completion.for_bash(["node=gpu01"], "node=g", "\"'><=;|&(:") == ["gpu01"]
    assert completion.for_bash(["plan"], "pl", "\"'><=;|&(:") == ["plan"]


def bash(env: dict[str, str], line: str, words: list[str]) -> list[str]:
    """Load ``runbook completion bash`` into bash and complete ``line`` as bash would
    (COMP_WORDS split at its word breaks, the cursor at the end)."""
    script = (
        'eval "$(runbook completion bash)"\n'
        'complete -p runbook\n'
        'COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; shift\n'
        'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))\n'
        '_runbook_complete runbook "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "--norc", "-c", script, "bash", line, *words], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    registered, *found = done.stdout.splitlines()
    assert registered == "complete -o default -F _runbook_complete runbook"
    return [f for f in found if f]


def test_bash_completes_commands_parameters_and_nodes(env: dict[str, str]) -> None:
    assert bash(env, "runbook pl", ["runbook", "pl"]) == ["plan"]
    assert bash(env, "runbook plan drain-node no",
                ["runbook", "plan", "drain-node", "no"]) == ["node="]
    # bash splits node=g at "=": the candidates are what follows it
    assert bash(env, "runbook plan drain-node node=g",
                ["runbook", "plan", "drain-node", "node", "=", "g"]) == ["gpu01", "gpu02"]
    assert bash(env, "runbook node ", ["runbook", "node", ""]) == ["gpu01", "gpu02", "hx1"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (make deps)")
def test_zsh_completes_parameters_without_a_space_and_nodes(env: dict[str, str]) -> None:
    """The zsh function with compadd standing in for zsh's own (which needs a terminal):
    a candidate ending in "=" is added with no suffix, others with the usual space."""
    script = (
        'eval "$(runbook completion zsh)"\n'
        'compadd() { local s=" "; [[ $1 == -S ]] && { s=$2; shift 2 }; shift\n'
        '  for w in "$@"; do print -r -- "$w|$s"; done }\n'
        'words=(runbook plan drain-node no); CURRENT=4; _runbook\n'
        'words=(runbook plan drain-node node=g); CURRENT=4; _runbook\n'
    )
    done = subprocess.run(["zsh", "-f", "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["node=|", "node=gpu01| ", "node=gpu02| "]


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"runbook {version('gpu-runbook-bot')}\n"
