"""The generate conformance suite every backend runs: tiny models of the layers, masks, caches, experts and
encoder-decoders a backend's engine must handle, each generating transformers' tokens (its own
``generate`` on CPU, same weights).

A backend's test package runs it from one module of its own, which names the backend and, where a
backend runs fewer, its cases::

    # packages/hfax-<backend>/tests/test_conformance.py
    from hfax.testing.conformance import *  # noqa: F403 (pytest collects what it imports)

    BACKEND = "torch_xla"
    CASES = ("bloom", "llama4", ...)  # optional: every case of :data:`CASES` when left out
    SEQ2SEQ_CASES = ("t5",)  # optional: those of CASES that also generate each source alone

Every case has spread random weights (a broken cache or mask changes their tokens) and a batch with a
left-padded row (an encoder-decoder's sources padded on the right, as its tokenizer pads them). What a
case is there for is the comment by its config. A backend's own tests cover what only it does
(compile counts, its refusals, beams of particular caches).

Tested by: packages/hfax-jax/tests/test_conformance.py, packages/hfax-torchxla/tests/test_conformance.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hfax.testing.batches import left_padded, right_padded
from hfax.testing.checkpoints import save_tiny
from hfax.testing.configs import (
    bert2bert_config,
    fsmt_config,
    led_config,
    looping_config,
    mask_config,
    prophetnet_config,
    switch_config,
    tiny_config,
)
from hfax.testing.references import as_numpy, assert_same_continuation, reference_generate

__all__ = [
    "CASES",
    "Case",
    "assert_generates_like_transformers",
    "backend",
    "config",
    "pytest_generate_tests",
    "test_each_source_alone_gives_its_row_of_the_batch",
    "test_generates_like_transformers",
]

PROMPTS = [[5, 17, 33, 9, 41, 8, 22, 60], [12, 50, 7, 31, 19]]
NEW_TOKENS = 10
PAD = 1


@dataclasses.dataclass(frozen=True)
class Case:
    """A tiny model (``config()``, a transformers config) and the ``generate`` options of its call;
    ``seq2seq``: an encoder-decoder, its sources the prompts padded on the right."""

    config: Callable[[], Any]
    seq2seq: bool = False
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


def _transformers() -> Any:
    import transformers

    return transformers


#: The sizes of the BART-family cases (BART, its decoder alone, MVP).
_BART_SIZES = dict(
    vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
)  # fmt: skip


def _gemma3(window: int) -> Any:
    return _transformers().Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip


def _t5gemma() -> Any:
    module = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return _transformers().T5GemmaConfig(
        encoder=module, decoder=module, vocab_size=64, pad_token_id=PAD, bos_token_id=2,
        eos_token_id=1,
    )  # fmt: skip


def _mamba_layers(name: str) -> Any:
    t = _transformers()
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8)
    decoder = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    if name == "bamba":
        return t.BambaConfig(**decoder, attn_layer_indices=[1], **mamba)
    if name == "falcon_h1":
        return t.FalconH1Config(**decoder, mamba_d_ssm=64, **mamba)
    return t.JambaConfig(
        **decoder, attn_layer_period=2, attn_layer_offset=1, num_experts=2, expert_layer_period=2,
        expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8, use_mamba_kernels=False,
    )  # fmt: skip


def _indexed(name: str) -> Any:
    t = _transformers()
    sizes = dict(
        vocab_size=64, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, index_topk=4, index_head_dim=16, index_n_heads=4,
        mlp_layer_types=["dense", "sparse"],
    )  # fmt: skip
    if name == "glm_moe_dsa":
        return t.GlmMoeDsaConfig(**sizes)
    return t.DeepseekV32Config(**sizes, n_group=1, topk_group=1)


def _experts(name: str) -> Any:
    t = _transformers()
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                 num_experts_per_tok=2)  # fmt: skip
    if name == "mixtral":
        return t.MixtralConfig(**sizes)
    return t.GptOssConfig(
        **sizes, head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=4
    )


def _cases() -> dict[str, Case]:
    t = _transformers
    return {
        # BLOOM builds ALiBi biases from the 2-D mask: it must get one as long as its keys, not a 4-D one.
        "bloom": Case(lambda: mask_config("bloom")),
        # Gemma 3's sliding layers beside a full one: a window shorter than the prompts, and one longer.
        "gemma3_window_3": Case(lambda: _gemma3(3)),
        "gemma3_window_4096": Case(lambda: _gemma3(4096)),
        # Llama 4's chunked layers see only their chunk of 4 positions (from each row's first real token).
        "llama4": Case(lambda: mask_config("llama4")),
        # Mamba: conv and SSM states taken as `cache_params`, no attention; the prompt's padding must not
        # reach the states (its mamba layers multiply their input by the 2-D mask's last columns).
        "mamba": Case(
            lambda: t().MambaConfig(
                vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4
            )
        ),  # fmt: skip
        # Mamba layers beside attention layers (Jamba, Bamba), and both in every layer (Falcon-H1).
        "jamba": Case(lambda: _mamba_layers("jamba")),
        "bamba": Case(lambda: _mamba_layers("bamba")),
        "falcon_h1": Case(lambda: _mamba_layers("falcon_h1")),
        # A layer that keeps nothing (an MLP) between a mamba layer and the attention layer: transformers
        # finds the attention layer's cache by skipping it.
        "nemotron_h": Case(
            lambda: t().NemotronHConfig(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=48,
                layers_block_type=["linear_attention", "mlp", "full_attention"],
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                mamba_num_heads=4,
                mamba_head_dim=16,
                ssm_state_size=8,
                n_groups=1,
                chunk_size=8,
            )
        ),  # fmt: skip
        # BART's decoder alone ignores position_ids and counts positions from the cache's length, which
        # padding the prompt into a bucket would shift.
        "bart_decoder": Case(lambda: t().BartConfig(**_BART_SIZES, forced_eos_token_id=None)),
        # Positions from the cache's length: torch.arange(past, past + n) with no position_ids to take
        # instead (MVP, TrOCR, RoFormer), a slice of ALiBi biases by it (MPT), a check of it against a
        # sinusoid table grown in Python (XGLM): hfax.patches.longtail.cache_positions.
        "mvp": Case(lambda: t().MvpConfig(**_BART_SIZES)),
        "trocr": Case(
            lambda: t().TrOCRConfig(
                vocab_size=64,
                d_model=32,
                decoder_layers=2,
                decoder_attention_heads=4,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
            )
        ),  # fmt: skip
        "roformer": Case(
            lambda: t().RoFormerConfig(
                vocab_size=64,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
                is_decoder=True,
            )
        ),  # fmt: skip
        "mpt": Case(
            lambda: t().MptConfig(
                vocab_size=64,
                d_model=32,
                n_heads=4,
                n_layers=2,
                expansion_ratio=2,
                max_seq_len=64,
            )
        ),  # fmt: skip
        "xglm": Case(
            lambda: t().XGLMConfig(
                vocab_size=64,
                d_model=32,
                num_layers=2,
                attention_heads=4,
                ffn_dim=64,
                max_position_embeddings=64,
            )
        ),  # fmt: skip
        # ProphetNet's decoder takes a step's position from the cache's length with int(), its relative
        # buckets from the keys' indices, and masks no key (hfax.patches.longtail.prophetnet).
        "prophetnet_decoder": Case(prophetnet_config),
        "prophetnet": Case(prophetnet_config, seq2seq=True),
        # BART-family configs force EOS as the last token; Whisper's suppress tokens as the first ones.
        "forced_eos_suppressed_first": Case(
            lambda: tiny_config("llama"),
            options=dict(eos_token_id=2, forced_eos_token_id=2, begin_suppress_tokens=[3, 4, 5]),
        ),
        # An indexer keeps keys of its own beside the keys and values and picks each query's top 4 of
        # them (GLM-5, DeepSeek V3.2): a wrong indexer key picks other slots.
        "glm_moe_dsa": Case(lambda: _indexed("glm_moe_dsa")),
        "deepseek_v32": Case(lambda: _indexed("deepseek_v32")),
        # OpenAI GPT takes no cache: generate reads the whole sequence every step, as transformers' does.
        "openai_gpt": Case(
            lambda: t().OpenAIGPTConfig(
                vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64
            )
        ),  # fmt: skip
        # Experts: transformers' grouped layout (Mixtral), one with biases and interleaved gate and up
        # (GPT-OSS), and those whose transformers code loops in Python over the experts a batch hits (a
        # data-dependent count no compiled program has), which hfax.patches.longtail runs statically.
        "mixtral": Case(lambda: _experts("mixtral")),
        "gpt_oss": Case(lambda: _experts("gpt_oss")),
        "dbrx": Case(lambda: looping_config("dbrx")),
        "jetmoe": Case(lambda: looping_config("jetmoe")),
        "longcat_flash": Case(lambda: looping_config("longcat_flash")),
        "xmod": Case(lambda: looping_config("xmod")),
        # Encoder-decoders: T5's relative positions and a decoder deeper than the encoder would be if the
        # cache were sized by it; BART; T5Gemma's encoder run alone; LED's encoder is Longformer's
        # windowed attention (a window shorter than the sources) and its decoder masks nothing in a
        # one-token step; FSMT grows its sinusoid table in Python; BERT as an EncoderDecoderModel's
        # decoder slices its positions at the cache's count; M2M-100 numbers its positions from its ids
        # plus that count; Switch Transformers routes its experts by a module it moves in its forward.
        "t5": Case(
            lambda: t().T5Config(
                vocab_size=64,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                decoder_start_token_id=0,
                pad_token_id=PAD,
                eos_token_id=2,
            ),
            seq2seq=True,
        ),  # fmt: skip
        "bart": Case(
            lambda: t().BartConfig(
                **_BART_SIZES,
                pad_token_id=PAD,
                bos_token_id=0,
                eos_token_id=2,
                decoder_start_token_id=2,
                forced_bos_token_id=0,
            ),
            seq2seq=True,
        ),
        "t5gemma": Case(_t5gemma, seq2seq=True),
        "led": Case(lambda: led_config(PAD), seq2seq=True),
        "fsmt": Case(lambda: fsmt_config(PAD), seq2seq=True),
        "bert2bert": Case(lambda: bert2bert_config(PAD), seq2seq=True),
        "m2m_100": Case(
            lambda: t().M2M100Config(
                vocab_size=64,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=48,
                decoder_ffn_dim=48,
                max_position_embeddings=64,
                pad_token_id=PAD,
                decoder_start_token_id=2,
            ),
            seq2seq=True,
        ),  # fmt: skip
        "switch_transformers": Case(lambda: switch_config(PAD), seq2seq=True),
    }


#: Every case by name (configs are built when a test runs: importing this module imports no transformers).
CASES: dict[str, Case] = {}


def config(name: str) -> Any:
    """The transformers config of case ``name``, for a backend's own tests of the same model."""
    if not CASES:
        CASES.update(_cases())
    return CASES[name].config()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test of the suite once per case the backend's module runs (its ``CASES``, or every one; its
    ``SEQ2SEQ_CASES``, or every encoder-decoder among them)."""
    if not CASES:
        CASES.update(_cases())
    names = set(getattr(metafunc.module, "CASES", CASES))
    encoder_decoders = {name for name in names if CASES[name].seq2seq}
    for argument, chosen in (
        ("case", names),
        ("seq2seq_case", set(getattr(metafunc.module, "SEQ2SEQ_CASES", encoder_decoders))),
    ):
        if argument not in metafunc.fixturenames:
            continue
        unknown = sorted(chosen - set(CASES))
        if unknown:
            raise ValueError(f"{metafunc.module.__name__} names cases the suite lacks: {unknown}")
        metafunc.parametrize(argument, sorted(chosen))


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend the module that runs the suite names (its ``BACKEND``)."""
    return request.module.BACKEND


def assert_generates_like_transformers(
    config: Any, directory: Any, backend: str, seq2seq: bool = False, **options: Any
) -> None:
    """Greedy ``generate`` of a tiny model of ``config`` (spread weights, saved to ``directory``) on
    ``backend`` gives transformers' tokens for :data:`PROMPTS`, with ``options`` and ``pad_token_id``
    :data:`PAD`: a decoder-only model's left-padded, an encoder-decoder's (``seq2seq``) sources padded on
    the right."""
    import hfax

    auto_class = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
    reference = save_tiny(config, directory, auto_class, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(directory), backend=backend)
    ids, mask = (right_padded if seq2seq else left_padded)(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, **options}
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    if not seq2seq:
        assert actual.shape == (len(PROMPTS), ids.shape[1] + NEW_TOKENS)
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_generates_like_transformers(backend: str, case: str, tmp_path: Any) -> None:
    """Greedy ``generate`` of the case's model gives transformers' tokens for the padded batch."""
    made = CASES[case]
    assert_generates_like_transformers(
        made.config(), tmp_path, backend, made.seq2seq, **made.options
    )


def test_each_source_alone_gives_its_row_of_the_batch(
    backend: str, seq2seq_case: str, tmp_path: Any
) -> None:
    """An encoder-decoder's row of a padded batch is what its source alone gives: the source's padding
    and its bucket reach neither the encoder's output nor the cross-attention."""
    import hfax

    made = CASES[seq2seq_case]
    save_tiny(made.config(), tmp_path, "AutoModelForSeq2SeqLM", spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    ids, mask = right_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, **made.options}
    batch = as_numpy(model.generate(ids, attention_mask=mask, **options))
    for row, source in enumerate(PROMPTS):
        alone = as_numpy(model.generate(np.array([source]), **options))
        np.testing.assert_array_equal(batch[row, : alone.shape[1]], alone[0])
