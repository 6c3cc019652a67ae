"""Fine-tuning through the NNX module: loss, gradients and AdamW steps against PyTorch; LoRA against PEFT;
checkpoints that transformers and PEFT load."""

import numpy as np
import optax
import peft
import pytest
import torch
import transformers
from flax import nnx

from hfax.backends.jax import train
from hfax.testing import as_numpy

LORA_TARGETS = {
    "llama": ["q_proj", "v_proj"],
    "gemma": ["q_proj", "down_proj"],
    "gemma3": ["k_proj", "down_proj"],
    "gpt2": ["c_attn"],
}
#: Grouped-query attention; one key/value head; Gemma 3's sliding and full layers, tied embeddings and
#: query/key norms; GPT-2's fused Conv1D projections.
FAMILIES = ["llama", "gemma", "gemma3", "gpt2"]
ADAMW = dict(learning_rate=1e-2, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def batch() -> dict[str, np.ndarray]:
    """Two rows of 12 tokens, the second right-padded by 3 (no loss there)."""
    ids = np.random.RandomState(0).randint(3, 128, (2, 12))
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    labels = np.where(mask == 1, ids, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def torch_batch() -> dict[str, torch.Tensor]:
    return {name: torch.as_tensor(value) for name, value in batch().items()}


def reference(directory) -> torch.nn.Module:
    """A fresh float32 PyTorch copy of the checkpoint (training changes it)."""
    return transformers.AutoModelForCausalLM.from_pretrained(directory)


def load(directory) -> train.TransformersModule:
    """The module, its loss 10 positions at a time: 3 chunks of 5 tokens over the 2 x 12 batch, the
    last one padded."""
    return train.from_pretrained(str(directory), loss_chunk=10)


def loss(module) -> object:
    return module.loss(**batch())


def flat(state) -> dict[tuple[str, ...], np.ndarray]:
    return {
        tuple(map(str, path)): np.asarray(value[...]) for path, value in nnx.to_flat_state(state)
    }


def assert_relative(actual: np.ndarray, expected: np.ndarray, tolerance: float, what: str) -> None:
    error = np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
    assert error <= tolerance, f"{what}: relative error {error:.2e} > {tolerance:.0e}"


def adamw_steps(module, wrt, steps: int = 10) -> list[float]:
    optimizer = nnx.Optimizer(module, optax.adamw(**ADAMW), wrt=wrt)

    @nnx.jit
    def step(module, optimizer):
        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, wrt))(module)
        optimizer.update(module, grads)
        return value

    return [float(step(module, optimizer)) for _ in range(steps)]


def torch_adamw_steps(model: torch.nn.Module, steps: int = 10) -> list[float]:
    lr, b1, b2, eps, decay = ADAMW.values()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, betas=(b1, b2), eps=eps, weight_decay=decay)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        value = model(**torch_batch()).loss
        value.backward()
        optimizer.step()
        losses.append(value.item())
    return losses


@pytest.mark.parametrize("name", FAMILIES)
def test_loss_and_gradients_equal_torch_autograd(tiny, name):
    directory, _, _ = tiny(name)
    module = load(directory)
    assert module.loss_head() is not None, "the loss is the chunked one"
    torch_model = reference(directory)
    expected = torch_model(**torch_batch()).loss
    expected.backward()

    value, grads = nnx.value_and_grad(loss)(module)
    np.testing.assert_allclose(float(value), expected.item(), rtol=0, atol=1e-5)
    grads = flat(grads)
    names = dict(torch_model.named_parameters())
    assert {path[1] for path in grads} == set(names), "one gradient per distinct PyTorch parameter"
    for path, grad in grads.items():
        assert_relative(grad, names[path[1]].grad.numpy(), 1e-5, f"gradient of {path[1]}")


def test_a_left_padded_batch_has_transformers_loss_and_gradients(tiny):
    """A left-padded row's first real token is predicted from the last padding position, which may see
    no key: its logits are what transformers' sdpa computes there (attention zeros), so the loss and
    gradients are PyTorch's, not only those of right-padded batches."""
    directory, _, _ = tiny("llama")
    inputs = batch()
    inputs["attention_mask"] = inputs["attention_mask"][:, ::-1].copy()
    inputs["labels"] = np.where(inputs["attention_mask"] == 1, inputs["input_ids"], -100)
    torch_model = reference(directory)
    expected = torch_model(**{name: torch.as_tensor(value) for name, value in inputs.items()}).loss
    expected.backward()
    value, grads = nnx.value_and_grad(lambda module: module.loss(**inputs))(load(directory))
    np.testing.assert_allclose(float(value), expected.item(), rtol=1e-6)
    names = dict(torch_model.named_parameters())
    for path, grad in flat(grads).items():
        assert_relative(grad, names[path[1]].grad.numpy(), 1e-5, f"gradient of {path[1]}")


def test_split_merge_and_jax_jit_over_state(tiny):
    directory, _, _ = tiny("llama")
    module = load(directory)
    graphdef, state = nnx.split(module)
    import jax

    value = jax.jit(lambda state: loss(nnx.merge(graphdef, state)))(state)
    expected = reference(directory)(**torch_batch()).loss.item()
    np.testing.assert_allclose(float(value), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_ten_adamw_steps_follow_torch(tiny, name):
    directory, _, _ = tiny(name)
    module = load(directory)
    torch_model = reference(directory)
    initial = {name: p.detach().numpy().copy() for name, p in torch_model.named_parameters()}
    losses = adamw_steps(module, nnx.Param)
    expected = torch_adamw_steps(torch_model)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-4)
    assert expected[-1] < expected[0] - 0.5, "the steps must change the weights"
    # Each weight's change, not each element: AdamW divides by the gradients' root mean square, so an
    # element whose gradient hovers near zero moves by rounding alone. On Gemma 3 (normed keys) float32
    # PyTorch's own changes differ from float64 PyTorch's by up to 7e-4 relative, element errors 8e-4.
    for name, parameter in torch_model.named_parameters():
        change = np.asarray(module.weights[name][...]) - initial[name]
        expected_change = parameter.detach().numpy() - initial[name]
        assert_relative(change, expected_change, 2e-3, f"change of {name}")


def peft_model(directory, name: str) -> torch.nn.Module:
    """PEFT's LoRA on a fresh PyTorch copy, with random (not zero) B so every gradient is non-trivial."""
    torch.manual_seed(1)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=LORA_TARGETS[name], init_lora_weights=False
    )
    return peft.get_peft_model(reference(directory), config)


def peft_logits(model: torch.nn.Module) -> np.ndarray:
    inputs = torch_batch()
    del inputs["labels"]
    with torch.no_grad():
        return model(**inputs).logits.numpy()


def module_logits(module) -> np.ndarray:
    inputs = batch()
    del inputs["labels"]
    return as_numpy(module(**inputs).logits)


@pytest.mark.parametrize("name", FAMILIES)
def test_lora_gradients_and_steps_follow_peft(tiny, name, tmp_path):
    directory, _, _ = tiny(name)
    torch_model = peft_model(directory, name)
    torch_model.save_pretrained(tmp_path / "initial")
    module = load(directory)
    train.load_adapter(module, tmp_path / "initial")
    np.testing.assert_allclose(module_logits(module), peft_logits(torch_model), rtol=0, atol=1e-5)

    expected = torch_model(**torch_batch()).loss
    expected.backward()
    value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(module)
    np.testing.assert_allclose(float(value), expected.item(), rtol=0, atol=1e-5)
    names = dict(torch_model.named_parameters())
    grads = flat(grads)
    assert len(grads) == 2 * len(module.adapters) > 0
    for (_, layer, kind), grad in grads.items():
        peft_name = f"base_model.model.{layer}.lora_{kind[-1].upper()}.default.weight"
        assert_relative(grad, names[peft_name].grad.numpy(), 1e-5, f"gradient of {peft_name}")

    torch_model.zero_grad()
    np.testing.assert_allclose(
        adamw_steps(module, nnx.LoRAParam), torch_adamw_steps(torch_model), rtol=0, atol=1e-4
    )


def test_trained_adapter_loads_in_peft_and_merged_model_in_transformers(tiny, tmp_path):
    directory, _, _ = tiny("llama")
    module = load(directory)
    train.add_lora(module, LORA_TARGETS["llama"], rank=4, alpha=8)
    before = module_logits(module)
    adamw_steps(module, nnx.LoRAParam, steps=3)
    logits = module_logits(module)
    assert np.abs(logits - before).max() > 1e-3, "training must move the adapters"

    train.save_adapter(module, tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(reference(directory), tmp_path / "adapter")
    np.testing.assert_allclose(peft_logits(loaded), logits, rtol=0, atol=1e-5)

    train.save_pretrained(module, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    np.testing.assert_allclose(peft_logits(merged), logits, rtol=0, atol=1e-5)

    ids = batch()["input_ids"][:1, :6]
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad():
        expected = loaded.generate(input_ids=torch.as_tensor(ids), **greedy).numpy()
    np.testing.assert_array_equal(as_numpy(module.to_model().generate(ids, **greedy)), expected)


def test_merge_and_unmerge_keep_the_output(tiny):
    directory, _, _ = tiny("llama")
    module = load(directory)
    train.add_lora(module, ["q_proj"], rank=2)
    for adapter in module.adapters.values():
        adapter.lora_b[...] = adapter.lora_b[...] + 0.1
    adapted = module_logits(module)
    base = np.asarray(module.weights["model.layers.0.self_attn.q_proj.weight"][...])
    train.merge_lora(module)
    np.testing.assert_allclose(module_logits(module), adapted, rtol=0, atol=1e-5)
    merged = np.asarray(module.weights["model.layers.0.self_attn.q_proj.weight"][...])
    assert np.abs(merged - base).max() > 1e-3, "merging must change the weight"
    train.unmerge_lora(module)
    np.testing.assert_allclose(module_logits(module), adapted, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(module.weights["model.layers.0.self_attn.q_proj.weight"][...]), base, atol=1e-6
    )


def test_bad_lora_settings_and_labels_are_refused(tiny):
    directory, _, _ = tiny("llama")
    module = load(directory)
    with pytest.raises(ValueError, match=r"match no linear layer.*'o_proj'.*'q_proj'"):
        train.add_lora(module, ["attention"])
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        train.add_lora(module, ["q_proj"], rank=0)
    with pytest.raises(ValueError, match="not linear layers"):
        train.add_lora(module, ["self_attn"])
    inputs = batch()
    with pytest.raises(ValueError, match="labels have shape"):
        module(input_ids=inputs["input_ids"], labels=inputs["labels"][:, :-1])
