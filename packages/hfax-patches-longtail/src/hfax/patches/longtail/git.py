"""GIT's model, given a count of cached tokens it can branch on in torch_xla's decode step.

GIT's model widens a 2-D padding mask over its cached image tokens when ``past_key_values_length > 0``.
hfax's static cache counts with a tensor (one compiled decode step serves every position), and dynamo
cannot branch on a tensor ("Data-dependent branching"), although hfax hands GIT a ready 4-D mask, for
which the branch does nothing. So a decode step under dynamo with a 4-D mask gets the cache behind
:func:`.fixed_count.fixed_count`: the same layers, with a count of 1 (a decode step's count is at least 1). The mask
functions return a 4-D mask as it is, without reading the count. The JAX backend's count answers such
comparisons itself, so it keeps transformers' code.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

from hfax.patches.longtail.fixed_count import fixed_count
from hfax.signatures import cache_keyword

#: The backends whose models get :data:`PATCHES`.
BACKENDS = ("torch_xla",)


def model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``GitModel.forward``; a decode step traced by dynamo with a 4-D mask reads the cache with a count of 1."""
    name = cache_keyword(kwargs)  # the release's name for the cache, if one was passed
    cache, mask = kwargs.get(name), kwargs.get("attention_mask")
    if (
        torch.compiler.is_compiling()
        and isinstance(cache, Cache)
        and isinstance(mask, torch.Tensor)
        and mask.ndim == 4
        and isinstance(cache.get_seq_length(), torch.Tensor)
    ):
        kwargs[name] = fixed_count(cache, 1)
    return type(self).forward(self, *args, **kwargs)


#: class name -> (method, its replacement)
PATCHES = {"GitModel": ("forward", model_forward)}
