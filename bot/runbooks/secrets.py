"""Secret parameters (``secret: true``): in a plan, a placeholder; in the store, a ciphertext.

A plan is made with ``[secret:NAME:FINGERPRINT]`` in place of each secret value (a keyed
fingerprint: the plan's hash binds the very value, and an approval covers only it). The
value, encrypted with the site key, is kept beside the execution; ``Unsealer`` puts it back
into a step's arguments only as the action is called, and masks it in everything that comes
back (a failing command's argv, its stderr, a progress line) before anything is stored.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.runbooks.model import Runbook
from kit.secretbox import SecretBox, SecretKeyProblem

PLACEHOLDER = re.compile(r"\[secret:([a-z][a-z0-9_]*):([0-9a-f]{16})\]")
MASKED = "[secret:{name}]"
CLEAR_WORD = "[secret]"  # a value given for a name that is not a declared clear parameter
NO_KEY = ("it has a secret parameter ({names}) and the bot has no key to keep it: set "
          "secrets.key_file in the configuration or RUNBOOK_SECRET_KEY (docs/configuration.md)")


def placeholder(name: str, fingerprint: str) -> str:
    return f"[secret:{name}:{fingerprint}]"


def secret_names(runbook: Runbook) -> list[str]:
    return [name for name, spec in runbook.params.items() if spec.secret]


def has_placeholder(params: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and PLACEHOLDER.fullmatch(v) for v in params.values())


def seal_values(runbook: Runbook, values: Mapping[str, Any],
                box: SecretBox | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``values`` with each secret replaced by its placeholder, and name -> ciphertext.
    SecretKeyProblem when the runbook has a secret given and there is no key."""
    names = [n for n in secret_names(runbook) if values.get(n) is not None]
    if not names:
        return dict(values), {}
    if box is None:
        raise SecretKeyProblem(NO_KEY.format(names=", ".join(names)))
    sealed = dict(values)
    ciphertexts: dict[str, str] = {}
    for name in names:
        clear = str(values[name])
        sealed[name] = placeholder(name, box.fingerprint(runbook.name, name, clear))
        ciphertexts[name] = box.seal(clear)
    return sealed, ciphertexts


def scrub_raw(runbook: Runbook | None, raw: Mapping[str, str]) -> dict[str, str]:
    """A refused request's parameters as the audit log may keep them: with a runbook that has
    secret parameters, only the values of its clear parameters stay (a typo in a secret's
    name must not put the secret in the log)."""
    if runbook is None or not secret_names(runbook):
        return dict(raw)
    clear = {n for n, spec in runbook.params.items() if not spec.secret}
    return {key: value if key in clear else CLEAR_WORD for key, value in raw.items()}


@dataclass(frozen=True)
class Unsealer:
    """One execution's secrets: placeholder -> (name, clear value). Empty: nothing to do."""

    values: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def open(cls, params: Mapping[str, Any], ciphertexts: Mapping[str, str],
             box: SecretBox | None) -> Unsealer:
        wanted = {name: v for name, v in params.items()
                  if isinstance(v, str) and PLACEHOLDER.fullmatch(v)}
        if not wanted:
            return cls()
        if box is None:
            raise SecretKeyProblem(NO_KEY.format(names=", ".join(sorted(wanted))))
        missing = sorted(set(wanted) - set(ciphertexts))
        if missing:
            raise SecretKeyProblem(f"the stored value of {', '.join(missing)} is gone")
        return cls({mark: (name, box.open(ciphertexts[name])) for name, mark in wanted.items()})

    def clear(self) -> dict[str, str]:
        """name -> clear value (to plan again with the very values)."""
        return {name: value for name, value in self.values.values()}

    def unseal(self, value: Any) -> Any:
        """Arguments with every placeholder replaced by its value (only as an action runs)."""
        if not self.values:
            return value
        if isinstance(value, str):
            return PLACEHOLDER.sub(lambda m: self._clear_of(m.group(0)), value)
        if isinstance(value, list):
            return [self.unseal(item) for item in value]
        if isinstance(value, dict):
            return {key: self.unseal(item) for key, item in value.items()}
        return value

    def mask(self, value: Any) -> Any:
        """Text, lists and mappings with every secret value (also as a shell, JSON or Python
        literal quotes it) replaced by ``[secret:NAME]``."""
        if not self.values:
            return value
        if isinstance(value, str):
            return _masked(value, self._forms())
        if isinstance(value, list | tuple):
            return [self.mask(item) for item in value]
        if isinstance(value, dict):
            return {self.mask(key): self.mask(item) for key, item in value.items()}
        return value

    def mask_text(self, text: str) -> str:
        return _masked(text, self._forms())

    def _clear_of(self, mark: str) -> str:
        """A placeholder's value; one that is not this execution's stays as it is."""
        return self.values[mark][1] if mark in self.values else mark

    def _forms(self) -> list[tuple[str, str]]:
        forms = {form: MASKED.format(name=name) for name, clear in self.values.values()
                 for form in _quoted(clear) if form}
        return sorted(forms.items(), key=lambda item: -len(item[0]))  # longest first


def _quoted(clear: str) -> set[str]:
    return {clear, shlex.quote(clear), json.dumps(clear)[1:-1], repr(clear)[1:-1],
            json.dumps(clear, ensure_ascii=False)[1:-1]}


def _masked(text: str, forms: list[tuple[str, str]]) -> str:
    for form, mark in forms:
        text = text.replace(form, mark)
    return text
