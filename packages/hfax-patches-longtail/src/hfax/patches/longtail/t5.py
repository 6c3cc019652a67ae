"""T5, mT5 and UMT5: their sequence classifiers pool each row's last ``<eos>`` state with static shapes, on
every backend (:mod:`hfax.patches.longtail.eos_pooling`)."""

from __future__ import annotations

from hfax.patches.longtail import eos_pooling

#: The family's sequence classifiers, by class name.
CLASSIFIERS = (
    "T5ForSequenceClassification",
    "MT5ForSequenceClassification",
    "UMT5ForSequenceClassification",
)

#: The family's classifiers: class name -> (method, its replacement).
PATCHES = eos_pooling.classifiers(CLASSIFIERS)

#: The family's other change: each classifier checks its ids' ``<eos>`` counts on the host.
patch_model = eos_pooling.bind_check(CLASSIFIERS)
