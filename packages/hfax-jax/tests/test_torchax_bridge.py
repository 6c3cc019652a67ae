import torch

from hfax.backends.jax import _torchax_compat
from hfax.backends.jax.runtime import torchax


def test_torchax_imports_under_this_torch():
    assert torchax.default_env() is not None


def test_removed_overloads_are_answered_with_the_existing_object():
    with _torchax_compat._named_overloads_answered():
        assert torch.ops.aten.prod.dim_Dimname is torch.ops.aten.prod.dim_int
        assert torch.ops.aten.unbind.Dimname is torch.ops.aten.unbind.int
        assert torch.ops.aten.std.names_dim is torch.ops.aten.std.dim


def test_the_bridge_is_removed_after_import():
    assert torch._ops.OpOverloadPacket.__getattr__.__module__ == "torch._ops"
    try:
        torch.ops.aten.prod.dim_Dimname  # noqa: B018 - the lookup itself is what is tested
    except AttributeError:
        pass
    else:  # torch brought the overload back: the bridge can go
        raise AssertionError("torch has dim_Dimname again; delete _torchax_compat.py")
