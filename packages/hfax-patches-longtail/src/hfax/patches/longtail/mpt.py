"""MPT's attention, its ALiBi bias chosen without reading the cache's count, on every backend.

MPT's attention reads the count of tokens the cache held only to choose its ALiBi bias's query rows
(``max(0, rows - (n + past))``, a slice at a value; hfax's static cache counts with a tensor, one compiled
decode step serving every position). The bias ``MptModel`` builds has one row, which every count chooses,
so the attention is handed the cache with a count of 0 for that choice (:mod:`.fixed_count`).
"""

from __future__ import annotations

from typing import Any

from hfax.patches.longtail.fixed_count import fixed_count
from hfax.signatures import cache_keyword


def mpt_attention(self: Any, hidden_states: Any, position_bias: Any, **kwargs: Any) -> Any:
    """``MptAttention.forward``, its bias's query rows chosen without reading the cache's count (a tensor
    under hfax's static cache) where the bias has a single row, as ``MptModel`` builds it. ``MptBlock``
    passes the cache by keyword, under the release's name for it."""
    name = cache_keyword(kwargs)
    if name is not None and position_bias is not None and position_bias.size(1) == 1:
        kwargs[name] = fixed_count(kwargs[name], 0)
    return type(self).forward(self, hidden_states, position_bias, **kwargs)


#: MPT's attention: class name -> (method, its replacement).
PATCHES = {"MptAttention": ("forward", mpt_attention)}
