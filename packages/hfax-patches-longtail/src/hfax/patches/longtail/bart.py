"""BART, mBART, PLBart and BigBird-Pegasus: their sequence classifiers pool each row's last ``<eos>`` state with static shapes, on
every backend (:mod:`hfax.patches.longtail.eos_pooling`)."""

from __future__ import annotations

from hfax.patches.longtail import eos_pooling
from hfax.patches.longtail.family import LongTailFamily

#: The family's sequence classifiers, by class name.
CLASSIFIERS = (
    "BartForSequenceClassification",
    "MBartForSequenceClassification",
    "PLBartForSequenceClassification",
    "BigBirdPegasusForSequenceClassification",
)

#: The family's hooks (entry point ``bart``).
plugin = LongTailFamily(
    "bart",
    ("bart", "mbart", "plbart", "bigbird_pegasus"),
    eos_pooling.classifiers(CLASSIFIERS),
    eos_pooling.bind_check(CLASSIFIERS),
)
