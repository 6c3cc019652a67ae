"""The compiled train step: gradient accumulation, mixed precision, meshes, one compile per shape."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import hfax
from hfax.backends.jax import monitor, train


def batch(rows: int = 8, tokens: int = 16) -> dict[str, np.ndarray]:
    """Rows right-padded by different amounts, so micro-batches score different token counts."""
    ids = np.random.RandomState(rows + tokens).randint(3, 128, (rows, tokens))
    mask = (np.arange(tokens)[None, :] < tokens - np.arange(rows)[:, None] % 5).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": np.where(mask == 1, ids, -100)}


def run(module, steps: int = 3, **options) -> list[float]:
    trainer = train.Trainer(module, optax.adamw(1e-2), **options)
    return [float(trainer.step(batch())) for _ in range(steps)]


@pytest.fixture(scope="module")
def one_device_losses(tiny):
    directory, _, _ = tiny("llama")
    return run(train.from_pretrained(str(directory)))


def test_accumulated_micro_batches_equal_the_whole_batch(tiny, one_device_losses):
    directory, _, _ = tiny("llama")
    losses = run(train.from_pretrained(str(directory)), accumulate=4)
    np.testing.assert_allclose(losses, one_device_losses, rtol=0, atol=1e-5)
    assert one_device_losses[-1] < one_device_losses[0] - 0.1, "the steps must train"


@pytest.mark.parametrize("axes", [{"fsdp": 8}, {"data": 2, "model": 4}])
def test_a_mesh_gives_the_one_device_losses(tiny, one_device_losses, axes):
    directory, _, _ = tiny("llama")
    module = train.from_pretrained(str(directory), mesh=hfax.make_mesh(**axes))
    sharded = [v for v in module.weights.values() if len(v[...].sharding.device_set) == 8]
    assert sharded and any(not v[...].sharding.is_fully_replicated for v in sharded)
    np.testing.assert_allclose(run(module), one_device_losses, rtol=0, atol=1e-5)


def test_the_loaded_model_keeps_working_with_the_trained_weights(tiny):
    # The step donates the weights; the model the module was made from must not be left holding them.
    directory, _, _ = tiny("llama")
    module = train.from_pretrained(str(directory))
    before = np.asarray(module.model(input_ids=batch()["input_ids"][:2]).logits)
    run(module, steps=2)
    ids = batch()["input_ids"][:2]
    after = np.asarray(module.model(input_ids=ids).logits)
    np.testing.assert_allclose(after, np.asarray(module(input_ids=ids).logits), atol=1e-5)
    assert np.abs(after - before).max() > 1e-3, "the model must hold the trained weights"


def test_the_step_compiles_once_per_shape(tiny):
    directory, _, _ = tiny("llama")
    module = train.from_pretrained(str(directory))
    train.add_lora(module, ["q_proj", "v_proj"], rank=4)
    trainer = train.Trainer(module, optax.adamw(1e-2), wrt=nnx.LoRAParam)
    before = monitor.snapshot().by_function
    for tokens in (16, 16, 16, 32, 32, 16):
        trainer.step(batch(tokens=tokens))
    after = monitor.snapshot().by_function
    compiled = {name: after[name] - before.get(name, 0) for name in after if "_train_step" in name}
    assert list(compiled.values()) == [2], f"one program per shape, got {compiled}"


def test_16_bit_base_weights_train_float32_adapters(tiny):
    directory, _, _ = tiny("llama")
    module = train.from_pretrained(str(directory), dtype="bfloat16")
    train.add_lora(module, ["q_proj", "v_proj"], rank=4)
    losses = run(module, steps=5, wrt=nnx.LoRAParam)
    assert losses[-1] < losses[0] - 0.05, f"LoRA on bfloat16 weights must train: {losses}"
    assert module.weights["model.layers.0.self_attn.q_proj.weight"][...].dtype == jnp.bfloat16
    adapter = module.adapters["model.layers.0.self_attn.q_proj"]
    assert adapter.lora_a[...].dtype == adapter.lora_b[...].dtype == jnp.float32


def test_mixed_precision_keeps_float32_weights(tiny, one_device_losses):
    directory, _, _ = tiny("llama")
    module = train.from_pretrained(str(directory), compute_dtype="bfloat16")
    losses = run(module)
    np.testing.assert_allclose(losses, one_device_losses, rtol=0, atol=5e-2)
    assert losses != one_device_losses, "the forward must run in bfloat16"
    assert all(v[...].dtype == jnp.float32 for v in module.weights.values() if v[...].ndim == 2)


def test_bad_batches_are_refused_before_compiling(tiny):
    directory, _, _ = tiny("llama")
    trainer = train.Trainer(train.from_pretrained(str(directory)), optax.sgd(0.1), accumulate=3)
    with pytest.raises(ValueError, match="multiple of 3 rows"):
        trainer.step(batch())
    with pytest.raises(ValueError, match="needs \\['labels'\\]"):
        trainer.step({"input_ids": batch()["input_ids"]})
    with pytest.raises(ValueError, match="accumulate must be a positive integer"):
        train.Trainer(trainer.module, optax.sgd(0.1), accumulate=0)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_remat_checkpoints_every_layer_and_keeps_loss_and_gradients(tiny, name):
    import jax

    directory, _, _ = tiny(name)
    plain = train.from_pretrained(str(directory))
    module = train.from_pretrained(str(directory), remat=True)
    train.add_lora(module, ["c_attn"] if name == "gpt2" else ["q_proj"], rank=2)
    inputs = batch()

    def grads(module):
        return nnx.value_and_grad(lambda m: m(**inputs).loss, argnums=nnx.DiffState(0, nnx.Param))(
            module
        )

    graphdef, state = nnx.split(module)
    program = str(jax.make_jaxpr(lambda state: grads(nnx.merge(graphdef, state)))(state))
    remats = program.count(" remat2[") + program.count(" checkpoint[")  # jax.checkpoint's names
    assert remats == module.config.num_hidden_layers, f"one per layer, got {remats}"
    (value, expected), (plain_value, plain_grads) = grads(module), grads(plain)
    np.testing.assert_allclose(float(value), float(plain_value), rtol=0, atol=1e-6)
    for name_, grad in nnx.to_flat_state(plain_grads):
        np.testing.assert_allclose(
            np.asarray(expected["weights"][name_[1]][...]), np.asarray(grad[...]), atol=1e-6
        )
