"""Shell completion for ``runbook``: the bash and zsh scripts, and the candidates they ask for.

The scripts are thin: on each TAB they run ``runbook completion words`` with the line so far,
and this module answers from the command line's own parser (commands, options, choices) and
the configuration (runbook names, their parameters as ``key=``, node names of the inventory).
It never changes anything and prints nothing but candidates; a problem means no candidates.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

BASH = r"""# bash completion for runbook: eval "$(runbook completion bash)" (in ~/.bashrc)
_runbook_complete() {
    local IFS=$'\n' line="${COMP_LINE:0:COMP_POINT}"
    COMPREPLY=($(COMP_WORDBREAKS="$COMP_WORDBREAKS" "$1" completion words --line "$line" \
                 2>/dev/null))
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *= ]]; then
        compopt -o nospace 2>/dev/null
    fi
}
complete -o default -F _runbook_complete runbook
"""

ZSH = r"""#compdef runbook
# zsh completion for runbook: eval "$(runbook completion zsh)" after compinit (in ~/.zshrc),
# or save it as _runbook in a folder of $fpath
_runbook() {
    local -a found spaced bare
    local c
    found=("${(@f)$("${words[1]}" completion words -- "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    for c in $found; do
        [[ -z $c ]] && continue
        if [[ $c == *= ]]; then bare+=("$c"); else spaced+=("$c"); fi
    done
    (( $#spaced )) && compadd -- $spaced
    (( $#bare )) && compadd -S '' -- $bare
    (( $#found ))
}
if (( $+functions[compdef] )); then compdef _runbook runbook; fi
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}

# Subcommands whose positional NAME is a runbook, and their key=value positionals.
RUNBOOK_POSITIONAL = {"name"}
NODE_POSITIONAL = {"names"}
NODE_OPTIONS = {"--node"}
RUNBOOK_OPTIONS = {"--runbook"}


def words_of_line(line: str) -> list[str]:
    """The words of a command line up to the cursor; the last one is the word being typed."""
    try:
        words = shlex.split(line)
    except ValueError:  # an open quote: the word being typed
        words = shlex.split(line + '"') if '"' in line else shlex.split(line + "'")
    if not line or line[-1].isspace():
        words.append("")
    return words[1:]  # without the program's name


def for_bash(candidates: Iterable[str], current: str, wordbreaks: str) -> list[str]:
    """bash replaces only the part of the word after its last word-break character (``=``,
    ``:``): strip what is before it from each candidate."""
    cut = max((current.rfind(ch) for ch in wordbreaks if ch not in " \t\n\"'"), default=-1)
    return [c[cut + 1:] for c in candidates]


class Sources:
    """Where the names come from: the configuration, read only when a name is wanted."""

    def __init__(self, config_file: str | None) -> None:
        self._file = config_file
        self._config: Any = None
        self._books: dict[str, dict[str, Any]] | None = None

    def config(self) -> Any:
        from bot.config import load_config

        if self._config is None:
            self._config = load_config(self._file)
        return self._config

    def runbooks(self) -> dict[str, dict[str, Any]]:
        """Runbook name -> its parameters, read from the files as YAML (no validation)."""
        if self._books is None:
            from bot.runbooks.loading import runbook_files

            self._books = {}
            for file in runbook_files(self.config().runbook_paths):
                data = _yaml(file)
                if isinstance(data, dict) and isinstance(data.get("name"), str):
                    self._books[data["name"]] = dict(data.get("params") or {})
        return self._books

    def nodes(self) -> list[str]:
        """The inventory's nodes: those configured, else those the pools list."""
        config = self.config()
        names = set(config.inventory.nodes) | set(config.inventory.names)
        if not names and config.inventory.discover and (config.slurm or config.kubernetes):
            from bot.surfaces.nodeparts import node_parts

            names = set(node_parts(config).inventory.nodes)
        return sorted(names)


def _yaml(file: Path) -> Any:
    try:
        return yaml.load(file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def candidates(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """What may follow: ``words`` are those after ``runbook``, the last being typed."""
    *done, current = words or [""]
    sources = Sources(_option_value(done, "--config"))
    command, rest = _split_command(parser, done)
    if command is None:
        if done and done[-1] == "--config":
            return []  # a file: the shell's own completion (-o default)
        return _starting(current, _options(parser) if current.startswith("-")
                         else _subcommands(parser))
    sub, rest = _innermost(_subcommands(parser)[command], rest)
    if rest and _takes_value(sub, rest[-1]):
        return _starting(current, _option_values(sub, rest[-1], sources))
    if current.startswith("-"):
        return _starting(current, _options(sub))
    return _starting(current, _positional(sub, rest, current, sources))


def _starting(prefix: str, found: Iterable[str]) -> list[str]:
    return sorted({c for c in found if c.startswith(prefix)})


def _innermost(sub: argparse.ArgumentParser, rest: list[str]
               ) -> tuple[argparse.ArgumentParser, list[str]]:
    """``audit verify ...``: the innermost subcommand typed, and the words after it."""
    inner = _subcommands(sub)
    for index, word in enumerate(rest):
        if word in inner:
            return _innermost(inner[word], rest[index + 1:])
    return sub, rest


def _option_value(words: list[str], option: str) -> str | None:
    for index, word in enumerate(words):
        if word == option and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings
            if opt.startswith("--")]


def _takes_value(parser: argparse.ArgumentParser, word: str) -> bool:
    action = parser._option_string_actions.get(word)
    return action is not None and action.nargs != 0


def _split_command(parser: argparse.ArgumentParser, done: list[str]
                   ) -> tuple[str | None, list[str]]:
    """The subcommand typed, if any, and the words after it."""
    skip = False
    for index, word in enumerate(done):
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = _takes_value(parser, word)
        elif word in _subcommands(parser):
            return word, done[index + 1:]
        else:
            return None, []
    return None, []


def _option_values(sub: argparse.ArgumentParser, option: str, sources: Sources) -> list[str]:
    action = sub._option_string_actions[option]
    if action.choices:
        return [str(c) for c in action.choices]
    if option in NODE_OPTIONS:
        return sources.nodes()
    if option in RUNBOOK_OPTIONS:
        return list(sources.runbooks())
    return []


def _positional(sub: argparse.ArgumentParser, rest: list[str], current: str,
                sources: Sources) -> list[str]:
    """The positional being typed: which one it is, counted from the words before it."""
    given = _positional_words(sub, rest)
    positionals = [a for a in sub._actions if not a.option_strings]
    for action in positionals:
        if isinstance(action, argparse._SubParsersAction):
            return [] if given else list(action.choices)
        many = action.nargs in ("*", "+")
        if given and not many:
            given = given[1:]
            continue
        return _values(action, given, current, sources, rest, sub.prog.split()[-1])
    return []


def _positional_words(sub: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    found, skip = [], False
    for word in rest:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = _takes_value(sub, word)
        else:
            found.append(word)
    return found


def _values(action: argparse.Action, given: list[str], current: str, sources: Sources,
            rest: list[str], command: str) -> list[str]:
    if action.choices:
        return [str(c) for c in action.choices]
    if action.dest in RUNBOOK_POSITIONAL:
        return list(sources.runbooks())
    if action.dest in NODE_POSITIONAL:
        return sources.nodes()
    if action.dest == "params":
        name = next((w for w in _positional_words_before(rest) if w in sources.runbooks()), None)
        return _parameters(sources, name, given, current) if name else []
    if action.dest == "words":
        return _words(command, sources, given, current)
    return []


def _positional_words_before(rest: list[str]) -> list[str]:
    return [w for w in rest if not w.startswith("-")]


def _parameters(sources: Sources, name: str, given: list[str], current: str) -> list[str]:
    """``key=`` for the runbook's parameters not given yet; after ``key=``, its values."""
    params = sources.runbooks()[name]
    if "=" not in current:
        taken = {w.split("=", 1)[0] for w in given}
        return [f"{key}=" for key in [*params, "change"] if key not in taken]
    key = current.split("=", 1)[0]
    spec = params.get(key) if isinstance(params.get(key), dict) else {}
    return [f"{key}={value}" for value in _param_values(spec or {}, sources)]


def _param_values(spec: dict[str, Any], sources: Sources) -> list[str]:
    kind = spec.get("type")
    if kind in ("node", "nodes"):
        return sources.nodes()
    if kind == "enum":
        return [str(c) for c in spec.get("choices") or []]
    if kind == "bool":
        return ["true", "false"]
    return []


_VERBS: dict[str, list[str]] = {
    "schedule": ["add", "list", "show", "approve", "pause", "resume", "remove"],
    "window": ["create", "list", "show", "approve", "open", "cancel"],
}


def _words(command: str, sources: Sources, given: list[str], current: str) -> list[str]:
    """``runbook schedule|window WORD...``: the verb, then for ``schedule add`` the runbook
    and its parameters, for ``window create`` the nodes."""
    if not given:
        return _VERBS.get(command, [])
    verb = given[0]
    if verb == "add" and len(given) == 1:
        return list(sources.runbooks())
    if verb == "add" and given[1] in sources.runbooks():
        extra = [w for w in ("cron=", "at=", "tz=", "approve=") if "=" not in current]
        return [*_parameters(sources, given[1], given[2:], current), *extra]
    if verb == "create" and len(given) == 1:
        return sources.nodes()
    return []


def answer(parser: argparse.ArgumentParser, words: list[str],
           out: Callable[[str], None], wordbreaks: str | None = None) -> None:
    """Print the candidates, one a line; with ``wordbreaks`` (bash), cut as bash wants."""
    try:
        found = candidates(parser, words)
    except Exception:  # a broken configuration or runbook: no candidates, no noise
        found = []
    if wordbreaks is not None:
        found = for_bash(found, words[-1] if words else "", wordbreaks)
    for item in found:
        out(item)
