"""The generate conformance suite (:mod:`hfax.testing.conformance`) on PyTorch/XLA: the cases whose
paths differ on this backend (its static cache layers, its dynamo-traced step), not every one, to keep
the file's compiled programs within what its test process holds."""

from hfax.testing.conformance import *  # noqa: F403 (pytest collects the suite's tests and hooks)

BACKEND = "torch_xla"
CASES = (
    "bloom", "llama4", "mamba", "bamba", "falcon_h1", "nemotron_h", "glm_moe_dsa", "deepseek_v32",
    "openai_gpt", "mixtral", "gpt_oss", "jetmoe", "roformer", "mpt", "prophetnet_decoder",
    "prophetnet", "m2m_100", "bert2bert", "led", "fsmt", "switch_transformers",
)  # fmt: skip
SEQ2SEQ_CASES = ()  # each source alone: packages/hfax-torchxla/tests/test_generate_seq2seq.py (T5)
