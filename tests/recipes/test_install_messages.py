"""A recipe missing its dependencies names the install command that works where the package runs: the editable
install of the checkout it runs from, or the missing distributions by name where it runs from an installed wheel
(the package is on no index, so ``pip install "modeling-tnn[train]"`` would find nothing)."""

from __future__ import annotations

import pytest

from modeling_tnn.recipes.common import extras

from tests.support import PROJECT_ROOT


def test_from_the_checkout_the_message_names_its_editable_install():
    with pytest.raises(ModuleNotFoundError) as refusal:
        extras.require_train_extra({"sklearn": "scikit-learn", "not_a_module_here": "not-a-distribution"})
    message = str(refusal.value)
    assert "needs not-a-distribution," in message and "scikit-learn" not in message
    assert f'`pip install -e ".[train]" in {PROJECT_ROOT}`' in message
    assert "modeling-tnn[train]" not in message


def test_from_an_installed_wheel_the_message_names_the_distributions(monkeypatch, tmp_path):
    monkeypatch.setattr(extras, "_CHECKOUT", tmp_path)  # no pyproject.toml of this project above the package
    with pytest.raises(ModuleNotFoundError, match="`pip install not-a-distribution other-one`"):
        extras.require_train_extra({"not_a_module_here": "not-a-distribution", "nor_this_one": "other-one"})
