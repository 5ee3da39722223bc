"""Optional dependencies are imported when first used; a missing one names the extra."""

from __future__ import annotations

import json

import pytest

from guardstack.integrations._extras import require


def test_an_installed_module_is_returned() -> None:
    assert require("json", "yaml") is json


def test_a_missing_module_names_the_extra_that_installs_it() -> None:
    with pytest.raises(ImportError) as raised:
        require("guardstack_no_such_module", "redis")
    assert str(raised.value) == (
        "this needs the 'guardstack_no_such_module' package: pip install 'guardstack[redis]'"
    )
    assert raised.value.name == "guardstack_no_such_module"
    assert isinstance(raised.value.__cause__, ImportError)
