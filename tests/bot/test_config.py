"""The configuration file: duration settings are read in the one duration grammar and a bad
one is refused when the file is read, not at the first plan that uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import Config, ConfigError, load_config


@pytest.mark.parametrize(("value", "kept"), [("45m", "45m"), ("1.5h", "1.5h"), (1800, "1800s")])
def test_a_duration_setting_takes_the_grammar_or_seconds(value: str | int, kept: str) -> None:
    assert Config.model_validate({"approval_expires": value}).approval_expires == kept


@pytest.mark.parametrize("key", ["approval_expires", "engine.default_step_timeout",
                                 "scheduling.misfire_grace"])
@pytest.mark.parametrize("value", ["90", "soon", "1h 30m", "-5m"])
def test_a_bad_duration_is_refused_when_the_file_is_read(tmp_path: Path, key: str,
                                                         value: str) -> None:
    section, _, name = key.rpartition(".")
    line = f'{name}: "{value}"'
    text = f"{section}:\n  {line}\n" if section else line + "\n"
    (tmp_path / "bot.yaml").write_text(text)
    with pytest.raises(ConfigError, match="duration"):
        load_config(tmp_path / "bot.yaml")
