"""hfax among JAX users' habits: their own meshes, their own transformations, their own JAX settings."""

import jax
import numpy as np
import pytest
import torch
from jax.sharding import AxisType

import hfax
from hfax.testing import left_padded, reference_generate

PROMPTS = [[1, 5, 9, 23, 7, 3], [4, 8, 15, 16]]


def greedy(model):
    ids, mask = left_padded(PROMPTS)
    return np.asarray(model.generate(ids, mask, max_new_tokens=6, min_new_tokens=6))


@pytest.fixture(scope="module")
def llama(tiny):
    """The tiny Llama's directory and transformers' greedy tokens for ``PROMPTS``."""
    directory, reference, _ = tiny("llama")
    ids, mask = left_padded(PROMPTS)
    return str(directory), reference_generate(
        reference, ids, mask, max_new_tokens=6, min_new_tokens=6
    )


@pytest.mark.parametrize(
    "axis_types",
    [None, (AxisType.Explicit, AxisType.Auto), (AxisType.Auto, AxisType.Auto)],
    ids=["explicit (jax.make_mesh's default)", "mixed", "auto"],
)
def test_a_users_jax_make_mesh_gives_transformers_tokens(llama, axis_types):
    directory, expected = llama
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=axis_types)
    model = hfax.AutoModelForCausalLM.from_pretrained(directory, backend="jax", mesh=mesh)
    q = model.params["model.layers.0.self_attn.q_proj.weight"]
    assert q.sharding.spec[0] == "model"  # split over the user's devices, not left whole
    np.testing.assert_array_equal(greedy(model), expected)


def test_other_axis_names_map_through_axis_names(llama):
    directory, expected = llama
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    model = hfax.AutoModelForCausalLM.from_pretrained(
        directory, backend="jax", mesh=mesh, axis_names={"model": "tp", "data": "dp"}
    )
    assert model.params["model.layers.0.mlp.down_proj.weight"].sharding.spec[1] == "model"
    assert list(model.mesh.devices.flat) == list(mesh.devices.flat)
    np.testing.assert_array_equal(greedy(model), expected)


def test_unknown_axis_names_are_refused_at_load_with_the_mapping_to_use(llama, monkeypatch):
    directory, _ = llama
    read = []
    monkeypatch.setattr(
        "transformers.AutoConfig.from_pretrained", lambda *a, **k: read.append(a) or 1 / 0
    )
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(ValueError, match=r"\['dp', 'tp'\] are not among hfax's axes.*axis_names="):
        hfax.AutoModelForCausalLM.from_pretrained(directory, backend="jax", mesh=mesh)
    with pytest.raises(ValueError, match=r"axis_names names \['mp'\], which the mesh lacks"):
        hfax.AutoModelForCausalLM.from_pretrained(
            directory, backend="jax", mesh=mesh, axis_names={"model": "mp"}
        )
    assert not read  # refused before anything was read


def test_model_call_runs_under_the_users_vmap_and_grad(tiny):
    _, reference, model = tiny("llama")
    ids = np.array([[1, 5, 9, 23, 7], [4, 8, 15, 16, 42]])
    logits = np.asarray(model(input_ids=ids).logits)
    rows = jax.vmap(lambda row: model(input_ids=row[None]).logits[0])(ids)
    np.testing.assert_allclose(np.asarray(rows), logits, atol=1e-5)

    embeds = reference.get_input_embeddings()(torch.as_tensor(ids)).detach().requires_grad_()
    reference(inputs_embeds=embeds).logits.square().mean().backward()
    grad = jax.grad(lambda e: (model(inputs_embeds=e).logits ** 2).mean())(embeds.detach().numpy())
    np.testing.assert_allclose(np.asarray(grad), embeds.grad.numpy(), atol=1e-6)


def test_loading_and_running_a_model_changes_no_global_jax_setting(tiny, monkeypatch):
    monkeypatch.delenv("HFAX_NO_COMPILATION_CACHE", raising=False)
    _, _, model = tiny("gpt2")
    model(input_ids=np.array([[1, 2, 3, 4, 5, 6, 7]]))
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
