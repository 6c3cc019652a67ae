"""bfloat16 generation on CPU: the decode loop reads the weights in 16 bits, and chooses PyTorch's tokens."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hfax
from hfax.backends.jax import decode_layout, generation
from hfax.testing import save_tiny

PROMPT = [[1, 17, 300, 42, 9, 77, 5]]


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    """A Llama big enough that its weights dominate a program's memory, in bfloat16, and its PyTorch twin."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    os.environ.setdefault(
        "HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache"))
    )  # not the user's cache
    directory = tmp_path_factory.mktemp("llama-bf16")
    save_tiny(config, directory, spread=True)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.bfloat16
    ).eval()
    model = hfax.AutoModelForCausalLM.from_pretrained(
        str(directory), backend="jax", dtype="bfloat16"
    )
    return reference, model


def test_decode_loop_holds_no_float32_copy_of_the_weights(bf16_llama):
    # XLA:CPU widens 16-bit weights for its dots and hoists the conversion of loop-invariant weights out of
    # the loop: a float32 copy of every weight, read by every step. Carried through the loop, they stay 16-bit.
    # The decode program (what streaming runs) is the loop alone: prefill's own temporaries are not in it.
    _, model = bf16_llama
    assert decode_layout.reads_16_bits(model)
    lowered = generation.lower(model, np.array(PROMPT), max_new_tokens=24)
    memory = lowered.compile().memory_analysis()
    weights = sum(p.nbytes for p in model.params.values())
    assert memory.temp_size_in_bytes < weights / 4, (memory.temp_size_in_bytes, weights)


def test_tokens_are_pytorch_bfloat16_choices(bf16_llama):
    # Every token hfax chose is PyTorch's bfloat16 argmax for the same prefix, up to bfloat16 rounding: the
    # logit PyTorch gives it is within `tolerance` of PyTorch's best; where PyTorch's choice leads clearly,
    # the tokens are the same.
    reference, model = bf16_llama
    new = 24
    tokens = np.array(model.generate(np.array(PROMPT), max_new_tokens=new, do_sample=False))
    with torch.no_grad():
        logits = reference(torch.from_numpy(tokens)).logits[0, len(PROMPT[0]) - 1 : -1].float()
    chosen = logits.gather(
        1, torch.as_tensor(tokens[0, len(PROMPT[0]) :], dtype=torch.long)[:, None]
    )[:, 0]
    best, runner_up = logits.topk(2, dim=1).values.unbind(1)
    tolerance = 4 * 2.0**-8 * logits.abs().max().item()  # four bfloat16 steps of the largest logit
    assert torch.all(chosen >= best - tolerance), (best - chosen).max()
    clear = (best - runner_up) > tolerance
    assert clear.sum() >= new // 2  # the check below is not vacuous
    assert torch.equal(chosen[clear], best[clear])
