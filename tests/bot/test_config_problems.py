"""A configuration's problems read as runbook problems do: every one at once, one a line,
``FILE:LINE: path: what is wrong (did you mean ...?)``; the command exits 2 with no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import ConfigError, load_config

BROKEN = """\
server:
  hostt: 127.0.0.1
  port: nope
inventroy:
  nodes: [gpu01]
slurm:
  backend: cli
  comands: {}
approval_expires: soon
alert_rules:
  - match: {alertname: GpuXid}
    runbok: drain-node
host_commands:
  hello: {argvv: [echo]}
"""


def problems_of(tmp_path: Path, text: str) -> list[str]:
    file = tmp_path / "bot.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(file)
    return [line.removeprefix(f"{file}:") for line in error.value.problems]


def test_every_problem_on_its_line_with_the_nearest_key(tmp_path: Path) -> None:
    assert problems_of(tmp_path, BROKEN) == [
        '2: server.hostt: unknown field (did you mean "host"?)',
        "3: server.port: Input should be a valid integer, unable to parse string as an integer",
        '4: inventroy: unknown field (did you mean "inventory"?)',
        '8: slurm.comands: unknown field (did you mean "commands"?)',
        '9: approval_expires: "soon" is not a duration: write a number with a unit, like 90s, '
        "30m, 2h or 1h30m",
        '12: alert_rules[0].runbok: unknown field (did you mean "runbook"?)',
        "14: host_commands.hello.argv: Field required",
        '14: host_commands.hello.argvv: unknown field (did you mean "argv"?)',
    ]


def test_a_key_far_from_every_field_gets_no_guess(tmp_path: Path) -> None:
    assert problems_of(tmp_path, "zzz: 1\n") == ["1: zzz: unknown field"]


def test_yaml_errors_name_the_file_and_line(tmp_path: Path) -> None:
    assert problems_of(tmp_path, "lab: true\nserver:\n  host: [\n") == [
        "4: not valid YAML: expected the node content, but found '<stream end>'"]
    assert problems_of(tmp_path, "server: {port: 1}\nserver: {port: 2}\n") == [
        '2: "server" appears twice in the same mapping']
    assert problems_of(tmp_path, "- lab\n") == ["1: the configuration must be a mapping"]


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    file = tmp_path / "bot.yaml"
    file.write_text("# nothing set\n")
    assert load_config(file).server.port == 8080


def test_the_command_line_exits_2_with_the_lines_and_no_traceback(tmp_path: Path) -> None:
    file = tmp_path / "bot.yaml"
    file.write_text(BROKEN)
    env = {**os.environ, "RUNBOOK_CONFIG": str(file)}
    for argv in (["list"], ["status", "1"], ["audit", "verify"], ["serve"]):
        done = subprocess.run([sys.executable, "-m", "bot", *argv], capture_output=True,
                              text=True, env=env, timeout=60, check=False)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        lines = done.stderr.splitlines()
        assert lines[0] == f'error: {file}:2: server.hostt: unknown field (did you mean "host"?)'
        assert len(lines) == 8 and all(line.startswith(f"{file}:") for line in lines[1:])
