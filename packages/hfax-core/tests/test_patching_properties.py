"""Patching an attribute that a property manages: unpatch must set the original back."""

from __future__ import annotations

from hfax import Patcher, unpatch


class Config:
    """Like a transformers config: ``_attn_implementation`` is a property over a private attribute."""

    def __init__(self) -> None:
        self._internal = "sdpa"

    @property
    def attn(self) -> str:
        return self._internal

    @attn.setter
    def attn(self, value: str) -> None:
        self._internal = value


class Model:
    def __init__(self) -> None:
        self.config = Config()


def test_unpatch_restores_a_property():
    model = Model()
    patcher = Patcher(model)
    patcher.setattr(model.config, "attn", "eager")
    patcher.setattr(model.config, "attn", "eager")  # twice is once
    assert model.config.attn == "eager" and len(patcher.patched) == 1
    unpatch(model)
    assert model.config.attn == "sdpa"
    assert "attn" not in vars(model.config)
