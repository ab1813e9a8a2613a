"""The drivers section: pinned versions, the CUDA table and the floor it puts under a pool's
driver, and the refusal of a driver below it before any plan is made."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bot.config.drivers import DEFAULT_CUDA_MINIMUM, DriversConfig, below_floor, version_key
from bot.runbooks.model import Runbook
from bot.runbooks.params import Inventory, ParamError, validate


def test_versions_compare_field_by_field() -> None:
    assert version_key("550.54.15") > version_key("550.54.14")
    assert version_key("550.127.05") > version_key("550.54.15")  # not as text
    assert version_key("570.26") < version_key("570.86.10")


def test_the_floor_is_the_newest_cuda_versions_driver() -> None:
    drivers = DriversConfig.model_validate({"pools": {"slurm": {"cuda": ["12.2", "12.4", "11.8"]}}})
    assert drivers.floor("slurm") == ("550.54.14", "12.4")
    assert drivers.floor("kubernetes") is None  # no CUDA version named: no floor
    assert drivers.floors() == {"slurm": ("550.54.14", "12.4")}


def test_a_site_row_replaces_the_default_one() -> None:
    drivers = DriversConfig.model_validate({
        "pools": {"kubernetes": {"cuda": ["12.4"]}},
        "cuda_minimum": {"12.4": "525.60.13"}})  # minor version compatibility
    assert drivers.floor("kubernetes") == ("525.60.13", "12.4")
    assert drivers.cuda_table()["12.2"] == DEFAULT_CUDA_MINIMUM["12.2"]


@pytest.mark.parametrize("section, words", [
    ({"pools": {"slurm": {"cuda": ["12.7"]}}}, "12.7 not in the CUDA table"),
    ({"pools": {"slurm": {"cuda": ["twelve"]}}}, "not a CUDA version"),
    ({"pools": {"slurm": {"pinned": "535.161.08", "cuda": ["12.4"]}}}, "is below 550.54.14"),
    ({"pools": {"slurm": {"pinned": "latest"}}}, "not a driver version"),
    ({"pools": {"gpu": {}}}, "pools.gpu"),
    ({"cuda_minimum": {"12.4": "new"}}, "is not CUDA version: driver version"),
])
def test_bad_sections_are_refused_at_load(section: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        DriversConfig.model_validate(section)
    assert words in str(caught.value)


def test_below_floor_says_why() -> None:
    assert below_floor("550.54.15", ("550.54.14", "12.4")) is None
    assert below_floor("550.54.15", None) is None
    why = below_floor("535.161.08", ("550.54.14", "12.4"))
    assert why is not None and "535.161.08 is below 550.54.14" in why and "CUDA 12.4" in why


UPGRADE = Runbook.model_validate({
    "name": "upgrade", "version": "1.0.0", "summary": "s", "risk": "high",
    "params": {"pool": {"type": "enum", "choices": ["slurm", "kubernetes"], "default": "slurm"},
               "version": {"type": "version", "required": True, "driver_for_pool": "pool"}},
    "steps": [{"id": "a", "action": "chat.notify", "with": {"message": "x"}}]})


def test_a_driver_below_the_pools_floor_is_refused_before_a_plan() -> None:
    inventory = Inventory(driver_floors={"kubernetes": ("550.54.14", "12.4")})
    assert validate(UPGRADE, {"pool": "slurm", "version": "535.161.08"}, inventory)
    assert validate(UPGRADE, {"pool": "kubernetes", "version": "550.54.15"}, inventory)
    with pytest.raises(ParamError) as caught:
        validate(UPGRADE, {"pool": "kubernetes", "version": "535.161.08"}, inventory)
    assert "version: driver 535.161.08 is below 550.54.14" in str(caught.value)
    assert "drivers.pools.kubernetes.cuda" in str(caught.value)


def test_driver_for_pool_must_name_a_parameter() -> None:
    with pytest.raises(ValidationError, match="no parameter 'where'"):
        Runbook.model_validate({
            "name": "upgrade", "version": "1.0.0", "summary": "s", "risk": "high",
            "params": {"version": {"type": "version", "driver_for_pool": "where"}},
            "steps": [{"id": "a", "action": "chat.notify", "with": {"message": "x"}}]})
