"""The patch recorder: instance-only, idempotent, undoable. Plain objects stand in for torch modules here."""

from __future__ import annotations

import types

import pytest

import hfax
from hfax import Patcher, unpatch


class Config:
    def __init__(self) -> None:
        self.attn_implementation = "sdpa"


class Attention:
    scale = 1.0  # a class attribute: patches must shadow it on the instance, never change the class

    def forward(self, x: int) -> int:
        return x + 1


class Model:
    def __init__(self) -> None:
        self.config = Config()
        self.attention = Attention()
        self.layers = [Attention(), Attention()]


def test_patch_then_unpatch_restores_the_original_objects():
    model = Model()
    config, attention, layers = model.config, model.attention, model.layers
    patcher = Patcher(model)
    patcher.setattr(model.config, "attn_implementation", "hfax_jax")
    patcher.setattr(model, "attention", Attention())
    patcher.setattr(model, "layers", layers[:1])
    patcher.bind(model.layers[0], "forward", lambda self, x: x * 10)
    assert model.config.attn_implementation == "hfax_jax" and model.attention is not attention
    assert model.layers[0].forward(2) == 20
    unpatch(model)
    assert model.config is config and model.config.attn_implementation == "sdpa"
    assert model.attention is attention
    assert model.layers is layers and len(model.layers) == 2
    assert model.layers[0].forward(2) == 3
    assert "forward" not in vars(model.layers[0])  # the method comes from the class again


def test_patches_stay_on_the_instance():
    patched, other = Model(), Model()
    patcher = Patcher(patched)
    patcher.bind(patched.attention, "forward", lambda self, x: -x)
    patcher.setattr(patched.attention, "scale", 0.5)
    assert patched.attention.forward(1) == -1 and patched.attention.scale == 0.5
    assert other.attention.forward(1) == 2 and other.attention.scale == 1.0
    assert Attention.scale == 1.0 and Attention.forward(other.attention, 1) == 2
    unpatch(patched)
    assert "scale" not in vars(patched.attention) and patched.attention.scale == 1.0


def test_attribute_that_did_not_exist_is_removed_again():
    model = Model()
    Patcher(model).setattr(model.config, "sliding_window", 4)
    unpatch(model)
    assert not hasattr(model.config, "sliding_window")


def test_patching_twice_equals_patching_once():
    model = Model()

    def forward(self, x):
        return 0

    for _ in range(
        2
    ):  # e.g. from_model called twice on the same model: a new Patcher, the same record
        patcher = Patcher(model)
        patcher.setattr(model.config, "attn_implementation", "hfax_jax")
        patcher.bind(model.attention, "forward", forward)
    assert patcher.patched == [(model.config, "attn_implementation"), (model.attention, "forward")]
    unpatch(model)
    assert model.config.attn_implementation == "sdpa" and model.attention.forward(1) == 2


def test_repatching_with_a_new_value_still_restores_the_first_original():
    model = Model()
    patcher = Patcher(model)
    patcher.setattr(model.config, "attn_implementation", "first")
    patcher.setattr(model.config, "attn_implementation", "second")
    assert model.config.attn_implementation == "second" and len(patcher.patched) == 1
    unpatch(model)
    assert model.config.attn_implementation == "sdpa"


def test_unpatch_is_idempotent_and_patches_can_be_reapplied():
    model = Model()
    Patcher(model).setattr(model.config, "attn_implementation", "hfax_jax")
    unpatch(model)
    unpatch(model)
    assert model.config.attn_implementation == "sdpa"
    Patcher(model).setattr(model.config, "attn_implementation", "again")
    assert model.config.attn_implementation == "again"
    unpatch(model)
    assert model.config.attn_implementation == "sdpa"


def test_unpatching_an_unpatched_model_does_nothing():
    model = Model()
    unpatch(model)
    assert model.config.attn_implementation == "sdpa"


@pytest.mark.parametrize("target", [types, Attention, hfax], ids=["module", "class", "hfax"])
def test_patching_modules_or_classes_is_refused(target):
    model = Model()
    with pytest.raises(TypeError, match="patches apply to instances only"):
        Patcher(model).setattr(target, "forward", lambda self, x: x)
    assert Patcher(model).patched == []
