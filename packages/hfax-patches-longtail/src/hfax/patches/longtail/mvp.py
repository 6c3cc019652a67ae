"""MVP: its learned positions count from the cache's length with a static shape
(:mod:`hfax.patches.longtail.cache_positions`), and its sequence classifier pools each row's last ``<eos>``
state with static shapes (:mod:`hfax.patches.longtail.eos_pooling`), on every backend."""

from __future__ import annotations

from hfax.patches.longtail import eos_pooling
from hfax.patches.longtail.cache_positions import counted_positions
from hfax.patches.longtail.family import LongTailFamily

#: MVP's sequence classifier, by class name.
CLASSIFIERS = ("MvpForSequenceClassification",)

#: MVP's positions and classifier: class name -> (method, its replacement).
STATIC = {
    "MvpLearnedPositionalEmbedding": ("forward", counted_positions),
    **eos_pooling.classifiers(CLASSIFIERS),
}

#: The family's hooks (entry point ``mvp``).
plugin = LongTailFamily("mvp", ("mvp",), STATIC, eos_pooling.bind_check(CLASSIFIERS))
