"""Tiny models whose transformers classes take a path hfax must handle apart (a local attention window
shorter than the batch, axial positions, an eager expert loop, several ``<eos>`` per row), each with a
batch that reaches that path and transformers' answer for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hfax.testing.batches import left_padded
from hfax.testing.checkpoints import save_tiny
from hfax.testing.configs import reformer_config
from hfax.testing.references import reference_forward


def longformer_batch(directory: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """A tiny Longformer masked LM saved to ``directory`` whose attention window (4 tokens) is shorter than
    its batch, and a left-padded batch whose rows hold different numbers of global tokens: transformers'
    logits for it, the inputs, and the mask of real tokens."""
    import transformers

    config = transformers.LongformerConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, attention_window=4, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    reference = save_tiny(config, directory, "AutoModelForMaskedLM", spread=True)
    ids, mask = left_padded([list(range(5, 22)), list(range(30, 41))])
    global_tokens = np.zeros_like(mask)
    global_tokens[0, [0, 7, 12]] = 1
    global_tokens[1, 9] = 1
    inputs = {"input_ids": ids, "attention_mask": mask, "global_attention_mask": global_tokens}
    expected = reference_forward(reference, **inputs).logits.float().numpy()
    return expected, inputs, mask.astype(bool)


def reformer_batch(directory: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """A tiny Reformer language model saved to ``directory`` whose 8 x 8 grid of axial positions is longer
    than its prompts (transformers cuts the grid to the rows the prompts reach), and a left-padded batch:
    transformers' logits for it, the inputs, and the mask of real tokens."""
    reference = save_tiny(reformer_config(), directory, "AutoModelForCausalLM", spread=True)
    ids, mask = left_padded([list(range(5, 17)), list(range(30, 37))])
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = reference_forward(reference, **inputs).logits.float().numpy()
    return expected, inputs, mask.astype(bool)


def eager_experts_batch(
    directory: str | Path,
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """A tiny OpenAI Privacy Filter token classifier saved to ``directory``: a mixture of experts whose class
    picks transformers' eager expert loop when nobody asks. transformers' logits for a left-padded batch,
    the inputs, and the mask of real tokens."""
    import transformers

    config = transformers.OpenAIPrivacyFilterConfig(
        vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        max_position_embeddings=64, num_labels=3, pad_token_id=0,
    )  # fmt: skip
    reference = save_tiny(config, directory, "AutoModelForTokenClassification", spread=True)
    assert reference.config._experts_implementation == "eager", "the class's own default changed"
    ids, mask = left_padded([[5, 9, 13, 2, 44, 7], [3, 8, 21, 30]])
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = reference_forward(reference, **inputs).logits.float().numpy()
    return expected, inputs, mask.astype(bool)


def eos_classifier(directory: str | Path, family: str) -> tuple[Any, dict[str, np.ndarray]]:
    """A tiny ``BartForSequenceClassification`` (``family="bart"``) or ``T5ForSequenceClassification``
    (``"t5"``) saved to ``directory``, and a left-padded batch whose rows hold two ``<eos>`` each, at
    different positions: the reference model and the inputs (with integer labels)."""
    import transformers

    if family == "bart":
        config = transformers.BartConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128,
            max_position_embeddings=64, num_labels=3, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        )  # fmt: skip
    else:
        config = transformers.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=128, num_labels=3,
            pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        )  # fmt: skip
    reference = save_tiny(config, directory, "AutoModelForSequenceClassification", spread=True)
    ids, mask = left_padded(
        [[5, 9, 2, 23, 7, 44, 2, 6], [17, 2, 8, 2, 30]], pad_token_id=config.pad_token_id
    )
    return reference, {"input_ids": ids, "attention_mask": mask, "labels": np.array([2, 0])}
