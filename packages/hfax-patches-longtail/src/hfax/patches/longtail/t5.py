"""T5, mT5 and UMT5: their sequence classifiers pool each row's last ``<eos>`` state with static shapes, on
every backend (:mod:`hfax.patches.longtail.eos_pooling`)."""

from __future__ import annotations

from hfax.patches.longtail import eos_pooling
from hfax.patches.longtail.family import LongTailFamily

#: The family's sequence classifiers, by class name.
CLASSIFIERS = (
    "T5ForSequenceClassification",
    "MT5ForSequenceClassification",
    "UMT5ForSequenceClassification",
)

#: The family's hooks (entry point ``t5``).
plugin = LongTailFamily(
    "t5",
    ("t5", "mt5", "umt5"),
    eos_pooling.classifiers(CLASSIFIERS),
    eos_pooling.bind_check(CLASSIFIERS),
)
