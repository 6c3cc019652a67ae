"""The patch recorder on real torch modules: submodules, parameters and methods come back unchanged."""

from __future__ import annotations

import pytest
import torch

from hfax import Patcher, unpatch


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        return self.mlp(x) * self.scale + self.offset


def test_unpatch_restores_submodules_parameters_buffers_and_methods():
    torch.manual_seed(0)
    block = Block()
    mlp, scale, offset = block.mlp, block.scale, block.offset
    x = torch.randn(2, 4)
    expected = block(x).detach()
    before = {name: tensor.clone() for name, tensor in block.state_dict().items()}

    patcher = Patcher(block)
    patcher.bind(block.mlp, "forward", lambda self, x: -x)
    patcher.setattr(block, "scale", torch.nn.Parameter(torch.full((4,), 2.0)))
    patcher.setattr(block, "offset", torch.ones(4))
    assert torch.equal(block(x), -x * 2 + 1)
    patcher.setattr(block, "mlp", torch.nn.Identity())
    assert torch.equal(block(x), x * 2 + 1)

    unpatch(block)
    assert block.mlp is mlp and block.scale is scale and block.offset is offset
    assert "mlp" in block._modules and "scale" in block._parameters and "offset" in block._buffers
    assert "forward" not in vars(mlp)
    assert torch.equal(block(x), expected)
    after = block.state_dict()
    assert before.keys() == after.keys() and all(
        torch.equal(before[name], after[name]) for name in before
    )


def test_patching_torch_classes_is_refused():
    with pytest.raises(TypeError, match="instances only"):
        Patcher(Block()).setattr(torch.nn.Linear, "forward", lambda self, x: x)
