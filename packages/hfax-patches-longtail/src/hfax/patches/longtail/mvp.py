"""MVP: its learned positions count from the cache's length with a static shape
(:mod:`hfax.patches.longtail.cache_positions`), and its sequence classifier pools each row's last ``<eos>``
state with static shapes (:mod:`hfax.patches.longtail.eos_pooling`), on every backend."""

from __future__ import annotations

from hfax.patches.longtail import eos_pooling
from hfax.patches.longtail.cache_positions import counted_positions

#: MVP's sequence classifier, by class name.
CLASSIFIERS = ("MvpForSequenceClassification",)

#: MVP's positions and classifier: class name -> (method, its replacement).
PATCHES = {
    "MvpLearnedPositionalEmbedding": ("forward", counted_positions),
    **eos_pooling.classifiers(CLASSIFIERS),
}

#: The family's other change: each classifier checks its ids' ``<eos>`` counts on the host.
patch_model = eos_pooling.bind_check(CLASSIFIERS)
