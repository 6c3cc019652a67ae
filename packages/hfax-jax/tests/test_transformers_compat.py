"""An hfax model where transformers' pipelines and user code look: the same answers as the PyTorch model."""

import jax
import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax.testing import save_tiny, save_tiny_tokenizer, tiny_config

PROMPTS = ["the capital of france is", "one two three four five six"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_a_pipeline_sees_a_cpu_model_in_inference_mode(tiny):
    directory, ref, model = tiny("llama")
    assert model.name_or_path == ref.name_or_path == str(directory)
    assert model.device == torch.device("cpu") and model.to("cpu") is model
    assert model.to(torch.device("cpu"), dtype=torch.float32) is model
    assert model.eval() is model and model.can_generate()
    assert model.config.model_type == "llama" and model.config.vocab_size == ref.config.vocab_size
    assert model.generation_config.eos_token_id == ref.generation_config.eos_token_id
    with pytest.raises(ValueError, match=r"places and casts weights when it loads.*dtype="):
        model.to(torch.bfloat16)


def test_torch_inputs_give_torch_outputs(tiny):
    _, ref, model = tiny("llama")
    ids = torch.tensor([[1, 5, 9, 23, 7]])
    logits = model(input_ids=ids).logits
    assert isinstance(logits, torch.Tensor) and logits.device.type == "cpu"
    torch.testing.assert_close(logits, ref(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_text_generation_pipeline_matches_transformers(tiny, tokenizer):
    """The pipeline's text is transformers', and it accepts the model as one of its own: the class is
    named after the transformers class it runs (pipelines check the name and log an error otherwise)."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    _, ref, model = tiny("llama")
    assert type(model).__name__ == type(ref).__name__ == "LlamaForCausalLM"
    assert isinstance(model, hfax.backends.jax.model.JaxModel)
    assert repr(model).startswith("JaxModel(LlamaForCausalLM, ")
    options = dict(max_new_tokens=8, do_sample=False)
    want = transformers.pipeline("text-generation", model=ref, tokenizer=tokenizer)(
        PROMPTS, **options
    )
    with CaptureLogger(logging.get_logger("transformers.pipelines.base")) as captured:
        pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
    assert "not supported" not in captured.out
    assert pipe(PROMPTS, **options) == want


def test_text_classification_pipeline_matches_transformers(tiny, tokenizer):
    _, ref, model = tiny("bert", "AutoModelForSequenceClassification")
    want = transformers.pipeline("text-classification", model=ref, tokenizer=tokenizer)(
        PROMPTS, top_k=None
    )
    got = transformers.pipeline("text-classification", model=model, tokenizer=tokenizer)(
        PROMPTS, top_k=None
    )
    for got_row, want_row in zip(got, want):
        assert [x["label"] for x in got_row] == [x["label"] for x in want_row]
        np.testing.assert_allclose(
            [x["score"] for x in got_row], [x["score"] for x in want_row], atol=1e-5
        )


def test_feature_extraction_pipeline_matches_transformers(tiny, tokenizer):
    _, ref, model = tiny("bert", "AutoModel")
    want = transformers.pipeline("feature-extraction", model=ref, tokenizer=tokenizer)(PROMPTS)
    got = transformers.pipeline("feature-extraction", model=model, tokenizer=tokenizer)(PROMPTS)
    for got_row, want_row in zip(got, want):
        np.testing.assert_allclose(np.array(got_row), np.array(want_row), atol=1e-4)


def test_fill_mask_pipeline_matches_transformers(tiny, tokenizer):
    _, ref, model = tiny("bert", "AutoModelForMaskedLM")
    prompts = ["the capital of <mask> is paris", "one two <mask> four"]
    want = transformers.pipeline("fill-mask", model=ref, tokenizer=tokenizer)(prompts)
    got = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer)(prompts)
    for got_row, want_row in zip(got, want):
        assert [x["token"] for x in got_row] == [x["token"] for x in want_row]
        np.testing.assert_allclose(
            [x["score"] for x in got_row], [x["score"] for x in want_row], atol=1e-5
        )


def test_token_classification_pipeline_matches_transformers(tmp_path, tokenizer):
    ref = save_tiny(tiny_config("bert"), tmp_path, "AutoModelForTokenClassification")
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")  # by architecture
    assert type(model.module).__name__ == "BertForTokenClassification"
    want = transformers.pipeline("token-classification", model=ref, tokenizer=tokenizer)(PROMPTS)
    got = transformers.pipeline("token-classification", model=model, tokenizer=tokenizer)(PROMPTS)
    for got_row, want_row in zip(got, want):
        assert [(x["word"], x["entity"]) for x in got_row] == [
            (x["word"], x["entity"]) for x in want_row
        ]
        np.testing.assert_allclose(
            [x["score"] for x in got_row], [x["score"] for x in want_row], atol=1e-5
        )


def test_generate_without_a_language_model_head_says_which_class_has_one(tiny):
    _, _, model = tiny("bert", "AutoModel")
    assert not model.can_generate()
    with pytest.raises(
        TypeError, match=r"BertModel has no language-model head.*AutoModelForCausalLM"
    ):
        model.generate(np.array([[1, 5, 9]]), max_new_tokens=2)


def reloaded_logits(model, directory, ids):
    model.save_pretrained(directory)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return reloaded(input_ids=torch.as_tensor(ids)).logits.numpy()


@pytest.mark.parametrize("mesh", [None, {"model": 8}, {"fsdp": 2, "model": 4}])
def test_save_pretrained_writes_a_checkpoint_transformers_reloads(tiny, tmp_path, mesh):
    checkpoint, ref, _ = tiny("gemma")  # tied embeddings: saved once, reloaded tied
    model = hfax.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), backend="jax", mesh=hfax.make_mesh(**mesh) if mesh else None
    )
    ids = np.array([[1, 5, 9, 23, 7, 3, 44, 101]])
    with torch.no_grad():
        want = ref(input_ids=torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_array_equal(reloaded_logits(model, tmp_path, ids), want)
    assert transformers.GenerationConfig.from_pretrained(tmp_path).eos_token_id == 2


def test_model_runs_under_the_users_jit(tiny):
    _, _, model = tiny("llama")
    ids = np.array([[1, 5, 9, 23, 7]])
    logits = jax.jit(lambda x: model(input_ids=x).logits)(ids)
    np.testing.assert_allclose(
        np.asarray(logits), np.asarray(model(input_ids=ids).logits), atol=1e-6
    )


def test_save_pretrained_keeps_bfloat16_weights_bit_for_bit(tiny, tmp_path):
    checkpoint, _, _ = tiny("llama")
    model = hfax.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), backend="jax", dtype="bfloat16"
    )
    model.save_pretrained(tmp_path)
    want = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    got = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert got.dtype == torch.bfloat16
    for name, tensor in want.state_dict().items():
        assert torch.equal(got.state_dict()[name], tensor), name
