"""Import torchax under torch 2.13.

torchax 0.0.13 names about twenty named-tensor (``Dimname``) operator overloads, e.g.
``aten.prod.dim_Dimname``, in module-level tables; torch 2.13 removed them, so ``import torchax`` raises
``AttributeError``. While torchax imports and builds its environment, a missing overload is answered with the *existing* overload it
mirrors (``dim_Dimname`` -> ``dim_int``): a new object would get its own, empty, entry in torchax's op
table. Remove this module once torchax supports torch 2.13.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Any, Iterator

import torch


def _positional_twin(packet: Any, name: str) -> Any:
    for candidate in (
        re.sub("(?i)dimname", "int", name),
        name.replace("names_", ""),
        name.replace("_names", ""),
        re.sub("(?i)_?dimname", "", name),
        "default",
    ):
        if candidate != name and candidate in packet.overloads():
            return getattr(packet, candidate)
    return getattr(packet, packet.overloads()[0])


@contextlib.contextmanager
def _named_overloads_answered() -> Iterator[None]:
    packet_class = torch._ops.OpOverloadPacket
    original = packet_class.__getattr__

    def lookup(self: Any, key: str) -> Any:
        try:
            return original(self, key)
        except AttributeError:
            if "dimname" not in key.lower() and "names" not in key:
                raise
            return _positional_twin(self, key)

    packet_class.__getattr__ = lookup
    try:
        yield
    finally:
        packet_class.__getattr__ = original


def import_torchax() -> Any:
    """Import torchax and build its default environment, bridging the overloads torch 2.13 removed."""
    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    with _named_overloads_answered():
        import torchax

        torchax.default_env()  # builds the op tables, which name more of the removed overloads
    return torchax
