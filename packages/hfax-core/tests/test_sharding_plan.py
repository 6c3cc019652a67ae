"""Sharding plans from transformers' tensor-parallel styles, and core's default plan."""

from __future__ import annotations

import pytest
import transformers

import hfax
from hfax import ShardingPlan
from hfax.plugins import get_plugin_manager


@pytest.fixture
def llama_plan() -> ShardingPlan:
    return ShardingPlan.from_tp_styles(
        transformers.LlamaConfig().base_model_tp_plan, prefix="model."
    )


@pytest.mark.parametrize(
    ("name", "ndim", "spec"),
    [
        (
            "model.layers.0.self_attn.q_proj.weight",
            2,
            ("model", None),
        ),  # colwise: split the outputs
        ("model.layers.17.self_attn.k_proj.weight", 2, ("model", None)),
        ("model.layers.3.mlp.up_proj.weight", 2, ("model", None)),
        ("model.layers.0.self_attn.o_proj.weight", 2, (None, "model")),  # rowwise: split the inputs
        ("model.layers.5.mlp.down_proj.weight", 2, (None, "model")),
        (
            "model.layers.0.self_attn.q_proj.bias",
            1,
            ("model",),
        ),  # a colwise bias follows the outputs
        ("model.layers.0.input_layernorm.weight", 1, (None,)),  # norms are replicated
        ("model.norm.weight", 1, (None,)),
        ("model.embed_tokens.weight", 2, (None, None)),  # not in the base plan: replicated
        (
            "model.layers.x.self_attn.q_proj.weight",
            2,
            (None, None),
        ),  # "*" stands for a layer index only
    ],
)
def test_llama_base_model_tp_plan(llama_plan, name, ndim, spec):
    assert llama_plan.spec_for(name, ndim) == spec


def test_plan_without_prefix_matches_inside_any_prefix():
    plan = ShardingPlan.from_tp_styles({"layers.*.mlp.up_proj": "colwise"})
    assert plan.spec_for("layers.1.mlp.up_proj.weight", 2) == ("model", None)
    assert plan.spec_for("model.layers.1.mlp.up_proj.weight", 2) == ("model", None)
    assert plan.spec_for("model.layers.1.mlp.up_proj_extra.weight", 2) == (None, None)


def test_styles_that_split_no_weight_replicate():
    plan = ShardingPlan.from_tp_styles({"norm": "sequence_parallel", "layers.*": "gather"})
    assert plan.rules == ()
    assert plan.spec_for("norm.weight", 1) == (None,)


def test_describe_pairs_each_shape_with_its_layout(llama_plan):
    shapes = {"model.layers.0.self_attn.o_proj.weight": (8, 8), "model.norm.weight": (8,)}
    assert llama_plan.describe(shapes) == [
        ("model.layers.0.self_attn.o_proj.weight", (None, "model")),
        ("model.norm.weight", (None,)),
    ]


def test_core_default_plan_comes_from_the_config_and_the_head(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")

    class CausalLM:  # what core reads from a transformers *ForCausalLM, without torch
        base_model_prefix = "model"
        _tp_plan = {"lm_head": "colwise_gather_output"}

        def __init__(self) -> None:
            self.model = object()

    config = transformers.LlamaConfig()
    plan = get_plugin_manager().hook.hfax_sharding_plan(
        model=CausalLM(), config=config, family="generic"
    )
    assert plan.spec_for("model.layers.2.self_attn.v_proj.weight", 2) == ("model", None)
    assert plan.spec_for("model.layers.2.mlp.down_proj.weight", 2) == (None, "model")
    assert plan.spec_for("lm_head.weight", 2) == ("model", None)
    assert plan.spec_for("model.norm.weight", 1) == (None,)


def test_core_default_plan_for_a_base_model(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")

    class BaseModel:  # a bare LlamaModel: its parameters have no "model." prefix
        base_model_prefix = "model"

    plan = get_plugin_manager().hook.hfax_sharding_plan(
        model=BaseModel(), config=transformers.LlamaConfig(), family="generic"
    )
    assert plan.spec_for("layers.0.self_attn.q_proj.weight", 2) == ("model", None)


def test_a_family_plan_overrides_core(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")

    class Family:
        @hfax.hookimpl
        def hfax_sharding_plan(self, model, config, family):
            return ShardingPlan((("embed", ("model", None)),)) if family == "mine" else None

    hfax.register(Family(), name="mine")
    hook = get_plugin_manager().hook.hfax_sharding_plan
    config = transformers.LlamaConfig()
    assert hook(model=object(), config=config, family="mine").spec_for("embed.weight", 2) == (
        "model",
        None,
    )
    assert hook(model=object(), config=config, family="other").spec_for(
        "layers.0.mlp.up_proj.weight", 2
    ) == ("model", None)
