"""The chunked causal LM loss (``train/loss.py``) against the plain forward's: values and gradients,
transformers' loss options, no whole logits in the program, and the models it leaves to the plain loss."""

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from hfax.backends.jax import train
from hfax.backends.jax.train import loss as chunked_loss
from hfax.testing import save_tiny, tiny_config


def batch() -> dict[str, np.ndarray]:
    """Three rows of 12 tokens, right-padded by 0, 3 and 5 (no loss there)."""
    ids = np.random.RandomState(1).randint(3, 128, (3, 12))
    mask = (np.arange(12)[None, :] < np.array([[12], [9], [7]])).astype(np.int64)
    return dict(input_ids=ids, attention_mask=mask, labels=np.where(mask == 1, ids, -100))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Tiny checkpoints; Gemma 3's with a final logit soft-capping small enough to matter."""

    def build(name: str):
        config = tiny_config(name)
        if name == "gemma3":
            config.final_logit_softcapping = 1.5
        directory = tmp_path_factory.mktemp(f"loss-{name}")
        save_tiny(config, directory, "AutoModelForCausalLM")
        return str(directory)

    return build


def value_and_grads(module, **options):
    def loss(module):
        return module.loss(**batch(), **options)

    value, grads = nnx.value_and_grad(loss)(module)
    return float(value), {path: np.asarray(grad[...]) for path, grad in nnx.to_flat_state(grads)}


#: Each head the chunked loss handles (Llama's, Gemma 3's soft-capped, GPT-2's tied to the embedding) with the
#: mean; ``num_items_in_batch`` only changes the divisor the chunks share, so one head shows it.
@pytest.mark.parametrize(
    "name, options",
    [("llama", {}), ("gemma3", {}), ("gpt2", {}), ("gpt2", {"num_items_in_batch": 40})],
    ids=["mean-llama", "mean-gemma3", "mean-gpt2", "num_items_in_batch-gpt2"],
)
def test_chunked_loss_and_gradients_equal_the_plain_ones(checkpoint, name, options):
    directory = checkpoint(name)
    plain = train.from_pretrained(directory, loss_chunk=None)
    expected, expected_grads = value_and_grads(plain, **options)
    for chunk in (3, 8, 1000):  # chunks that divide the 36 positions, one that does not, one chunk
        module = train.from_pretrained(directory, loss_chunk=chunk)
        assert module.loss_head() is not None
        value, grads = value_and_grads(module, **options)
        np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=f"loss, chunk {chunk}")
        assert grads.keys() == expected_grads.keys()
        for path, grad in grads.items():
            np.testing.assert_allclose(
                grad, expected_grads[path], rtol=0, atol=1e-6, err_msg=f"{path}, chunk {chunk}"
            )


def test_another_ignore_index(checkpoint):
    directory = checkpoint("gpt2")
    inputs = batch()
    expected = float(train.from_pretrained(directory, loss_chunk=None).loss(**inputs))
    inputs["labels"] = np.where(inputs["labels"] == -100, 5, inputs["labels"])
    value = train.from_pretrained(directory, loss_chunk=8).loss(**inputs, ignore_index=5)
    np.testing.assert_allclose(float(value), expected, rtol=1e-6)


def test_shift_labels_are_scored_as_given(checkpoint):
    directory = checkpoint("llama")
    inputs = batch()
    shifted = np.roll(inputs.pop("labels"), 3, axis=1)  # any targets, no shift applied to them
    values = [
        float(
            train.from_pretrained(directory, loss_chunk=chunk).loss(
                **inputs, labels=shifted, shift_labels=shifted
            )
        )
        for chunk in (None, 8)
    ]
    np.testing.assert_allclose(values[1], values[0], rtol=1e-6)


def test_the_program_never_holds_the_whole_logits(checkpoint):
    directory = checkpoint("gpt2")  # no other activation of the logits' shape (Llama's MLP has one)
    whole = "f32[3,12,128]"  # rows, tokens, vocabulary

    def program(chunk):
        module = train.from_pretrained(directory, loss_chunk=chunk)
        graphdef, state = nnx.split(module)
        grad = jax.grad(lambda state: nnx.merge(graphdef, state).loss(**batch()))
        return str(jax.make_jaxpr(grad)(state))

    assert whole in program(None)
    chunked = program(6)  # 2 positions of each row per chunk
    assert whole not in chunked
    assert "f32[3,2,128]" in chunked


def test_other_heads_keep_the_plain_loss(checkpoint):
    cohere = transformers.CohereForCausalLM(
        transformers.CohereConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=64,
        )
    )
    assert chunked_loss.head(cohere, set()) is None, "Cohere scales its logits"
    module = train.from_pretrained(checkpoint("llama"), loss_chunk=8)
    expected = float(module.loss(**batch()))
    train.add_lora(module, ["lm_head"], rank=2)
    assert module.loss_head() is None, "a LoRA-adapted output layer keeps the plain loss"
    np.testing.assert_allclose(float(module.loss(**batch())), expected, rtol=1e-6)
    with torch.no_grad():
        reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint("llama"))
        torch_loss = reference(**{k: torch.as_tensor(v) for k, v in batch().items()}).loss
    np.testing.assert_allclose(expected, torch_loss.item(), rtol=0, atol=1e-5)


def test_bad_loss_settings_are_refused(checkpoint):
    directory = checkpoint("llama")
    with pytest.raises(ValueError, match="loss_chunk must be a positive number"):
        train.from_pretrained(directory, loss_chunk=0)
    module = train.from_pretrained(directory)
    inputs = batch()
    del inputs["labels"]
    with pytest.raises(ValueError, match="module.loss needs labels"):
        module.loss(**inputs)
