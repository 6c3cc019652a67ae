"""Test fixtures for hfax and its plugins: fake installed distributions, tiny configs, checkpoints and
batches, and transformers on PyTorch/CPU as the reference to compare with.

A distribution of its own (hfax-testing), not part of hfax-core: its fixtures name particular
architectures, which the core must not, and no user install needs them. Each module holds one kind of
fixture; every name is also importable from ``hfax.testing`` itself::

    from hfax.testing import installed_distribution, save_tiny, tiny_config, assert_same_logits

- :mod:`~hfax.testing.distributions`: a plugin distribution on ``sys.path`` for one ``with`` block.
- :mod:`~hfax.testing.configs`: tiny configs by name, hand-set where a test needs a particular shape.
- :mod:`~hfax.testing.shrink`: a tiny config of any architecture, shrunk from its class's defaults.
- :mod:`~hfax.testing.checkpoints`: tiny checkpoints and a tokenizer saved to a folder.
- :mod:`~hfax.testing.batches`: left-padded batches and multimodal inputs, as numpy.
- :mod:`~hfax.testing.references`: transformers' outputs, and the comparisons of hfax with them.
- :mod:`~hfax.testing.cases`: tiny models with a batch that reaches a path hfax must handle apart.

The generate conformance suites, :mod:`~hfax.testing.conformance` and
:mod:`~hfax.testing.multimodal_conformance`, are test modules each backend's tests import whole (their
names are not re-exported here).

Importing it imports neither torch nor jax: the helpers that need torch import it when they run.
"""

from hfax.testing.batches import left_padded, multimodal_inputs, right_padded
from hfax.testing.cases import eager_experts_batch, eos_classifier, longformer_batch, reformer_batch
from hfax.testing.checkpoints import (
    TINY_WORDS,
    mapped_resident_bytes,
    save_tiny,
    save_tiny_byte_tokenizer,
    save_tiny_tokenizer,
    spread_weights,
    tiny_models,
)
from hfax.testing.configs import (
    ENCODER_SIZES,
    IMAGE_TOKEN,
    IMAGE_TOKENS,
    MULTIMODAL,
    TINY_SPECIAL,
    bert2bert_config,
    fsmt_config,
    led_config,
    looping_config,
    mask_config,
    prophetnet_config,
    reformer_config,
    switch_config,
    tiny_config,
    tiny_multimodal_config,
)
from hfax.testing.distributions import installed_distribution, write_distribution
from hfax.testing.references import (
    as_numpy,
    assert_same_continuation,
    assert_same_greedy,
    assert_same_logits,
    reference_forward,
    reference_generate,
)
from hfax.testing.shrink import shrunk_config

__all__ = [
    "ENCODER_SIZES",
    "IMAGE_TOKEN",
    "IMAGE_TOKENS",
    "MULTIMODAL",
    "TINY_SPECIAL",
    "TINY_WORDS",
    "as_numpy",
    "assert_same_continuation",
    "assert_same_greedy",
    "assert_same_logits",
    "bert2bert_config",
    "eager_experts_batch",
    "eos_classifier",
    "fsmt_config",
    "installed_distribution",
    "led_config",
    "left_padded",
    "longformer_batch",
    "looping_config",
    "mask_config",
    "mapped_resident_bytes",
    "multimodal_inputs",
    "prophetnet_config",
    "reference_forward",
    "reference_generate",
    "right_padded",
    "reformer_batch",
    "reformer_config",
    "save_tiny",
    "save_tiny_byte_tokenizer",
    "save_tiny_tokenizer",
    "shrunk_config",
    "spread_weights",
    "switch_config",
    "tiny_config",
    "tiny_models",
    "tiny_multimodal_config",
    "write_distribution",
]
