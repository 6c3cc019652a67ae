"""Helpers for testing hfax plugins: fake installed distributions, tiny checkpoints and PyTorch references.

``write_distribution`` lays out what ``pip install`` would leave in ``site-packages``: a ``.dist-info``
folder with ``entry_points.txt``, plus the plugin's modules. ``installed_distribution`` also puts it on
``sys.path`` for the duration of a ``with`` block, so hfax finds the plugin through its entry point, as
it would find an installed one::

    plugin = {"hfax_myfamily": SOURCE}  # module name -> source
    with installed_distribution(tmp_path / "d", "hfax-myfamily", {"myfamily": "hfax_myfamily"}, plugin):
        assert hfax.detect_family(config) == "myfamily"

Tiny models are built from transformers config classes with random weights, saved and loaded back through
``from_pretrained`` so the real loading code runs. Those helpers need torch (any backend brings it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from hfax.plugins import reset_plugins


def write_distribution(
    directory: str | Path,
    name: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
    version: str = "0.0.0",
) -> Path:
    """Write an installed distribution ``name`` into ``directory`` and return its ``.dist-info`` folder.

    ``entry_points`` maps plugin names to the objects the ``hfax`` group points at (``"module"`` or
    ``"module:attribute"``); ``modules`` maps module names to their source (dedented).
    """
    directory = Path(directory)
    dist_info = directory / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    lines = [f"{plugin} = {target}" for plugin, target in entry_points.items()]
    (dist_info / "entry_points.txt").write_text("[hfax]\n" + "\n".join(lines) + "\n")
    for module, source in (modules or {}).items():
        (directory / f"{module}.py").write_text(textwrap.dedent(source))
    return dist_info


@contextlib.contextmanager
def installed_distribution(
    directory: str | Path,
    name: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
    version: str = "0.0.0",
) -> Iterator[Path]:
    """Write a distribution into the new folder ``directory`` and make it visible to hfax until the block ends.

    Plugins are reloaded on the next use, inside the block and again after it. ``directory`` must be a
    folder of its own: importlib.metadata caches a folder's listing by its modification time.
    """
    write_distribution(directory, name, entry_points, modules, version)
    path = str(directory)
    sys.path.insert(0, path)
    importlib.invalidate_caches()
    reset_plugins()
    try:
        yield Path(directory)
    finally:
        sys.path.remove(path)
        for module in modules or {}:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()
        reset_plugins()


#: Special token ids of the tiny configs: padding 0, BOS 1, EOS 2.
TINY_SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_config(name: str) -> Any:
    """A tiny transformers config (2 layers, hidden size 64, vocabulary 128) every backend is tested on:
    ``"llama"`` (grouped-query attention), ``"gemma"`` (one key/value head), ``"mistral"`` (a sliding window of 5),
    ``"gemma2"`` (sliding and full layers), ``"gemma3"`` (a sliding layer of window 4, then a full one; tied
    embeddings, query/key norms), ``"gpt2"``, ``"gpt_neo"`` (a local layer of window 40), ``"moshi"`` (a cache window of 16 its masks ignore), ``"mamba"`` (recurrent layers, no attention), ``"bert"``."""
    import transformers

    if name == "llama":
        return transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if name == "gemma":
        return transformers.GemmaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if name == "mistral":  # a sliding window shorter than the prompts the tests use
        return transformers.MistralConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
            sliding_window=5,
            **TINY_SPECIAL,
        )
    if name == "gemma2":  # hybrid: sliding and full attention layers alternate
        return transformers.Gemma2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=128,
            max_position_embeddings=256,
            sliding_window=5,
            **TINY_SPECIAL,
        )
    if name == "gemma3":
        return transformers.Gemma3TextConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=128,
            max_position_embeddings=256,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            **TINY_SPECIAL,
        )
    if name == "gpt2":
        return transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, **TINY_SPECIAL
        )
    if name == "gpt_neo":  # a global layer, then a local one whose window is its own table
        return transformers.GPTNeoConfig(
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=40,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if (
        name == "moshi"
    ):  # Moshi's text decoder: its config's window reaches transformers' cache only
        return transformers.MoshiConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            ffn_dim=128,
            sliding_window=16,
            audio_vocab_size=64,
            num_codebooks=2,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if name == "mamba":
        return transformers.MambaConfig(
            hidden_size=64,
            state_size=8,
            num_hidden_layers=2,
            vocab_size=128,
            conv_kernel=4,
            **TINY_SPECIAL,
        )
    if name == "bert":
        return transformers.BertConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=128,
            max_position_embeddings=128,
            num_labels=3,
        )
    raise ValueError(
        f"no tiny config called {name!r}; there are llama, gemma, mistral, gemma2, gemma3, gpt2, "
        "mamba and bert"
    )


#: The multimodal models every backend's generate is tested on, by name: their transformers auto class.
MULTIMODAL = {
    "llava": "AutoModelForImageTextToText",
    "qwen2_vl": "AutoModelForImageTextToText",
    "gemma3": "AutoModelForImageTextToText",
    "whisper": "AutoModelForSpeechSeq2Seq",
}
#: The image placeholder token of :func:`tiny_multimodal_config`'s models, and how many each image takes.
IMAGE_TOKEN = 3
IMAGE_TOKENS = {"llava": 16, "qwen2_vl": 4, "gemma3": 4}


def tiny_multimodal_config(name: str) -> Any:
    """A tiny config of one of :data:`MULTIMODAL` (2 layers, hidden size 32, 16 x 16 images in 4 x 4
    patches; Whisper: 8 mel bins, 32 frames); :func:`multimodal_inputs` is what its processor returns."""
    import transformers

    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    encoder = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   image_size=16, patch_size=4)  # fmt: skip
    if name == "llava":
        return transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(**encoder, projection_dim=32),
            text_config=transformers.LlamaConfig(**text), image_token_id=IMAGE_TOKEN,
            projector_hidden_act="gelu", vision_feature_layer=-1,
        )  # fmt: skip
    if name == "qwen2_vl":
        rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
        vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, in_chans=3)  # fmt: skip
        return transformers.Qwen2VLConfig(
            text_config=dict(**text, rope_parameters=rope), vision_config=vision,
            image_token_id=IMAGE_TOKEN, video_token_id=4, vision_start_token_id=5,
            vision_end_token_id=6,
        )  # fmt: skip
    if name == "gemma3":
        return transformers.Gemma3Config(
            vision_config=transformers.SiglipVisionConfig(**encoder),
            text_config=transformers.Gemma3TextConfig(
                **{**text, "num_key_value_heads": 1}, head_dim=8, sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
            ),
            mm_tokens_per_image=4, image_token_index=IMAGE_TOKEN, boi_token_index=4,
            eoi_token_index=5,
        )  # fmt: skip
    if name == "whisper":
        return transformers.WhisperConfig(
            vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
            suppress_tokens=[], begin_suppress_tokens=[],
        )  # fmt: skip
    raise ValueError(f"no tiny multimodal config called {name!r}; there are {sorted(MULTIMODAL)}")


def multimodal_inputs(name: str, seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    """What the processor of :func:`tiny_multimodal_config` ``name`` returns for up to two prompts with
    one image each (Whisper: audio features): image tokens expanded in ``input_ids``, left padding, and the
    model's own extra inputs (Qwen2-VL's image grid and token types, Gemma 3's token types)."""
    rng = np.random.default_rng(seed)
    if name == "whisper":
        return {"input_features": rng.standard_normal((batch, 8, 32)).astype(np.float32)}
    image = [IMAGE_TOKEN] * IMAGE_TOKENS[name]
    if name == "qwen2_vl":  # between its vision start and end tokens, as its processor writes them
        image = [5, *image, 6]
    rows = [[1, 7, *image, 9, 10], [1, *image, 11, 12, 13, 14]][:batch]
    ids, mask = left_padded(rows)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if (
        name == "qwen2_vl"
    ):  # 16 patches of 3 x 2 x 4 x 4 values per image, merged 2 x 2 into 4 tokens
        inputs["pixel_values"] = rng.standard_normal((batch * 16, 96)).astype(np.float32)
        inputs["image_grid_thw"] = np.array([[1, 4, 4]] * batch)
        inputs["mm_token_type_ids"] = (ids == IMAGE_TOKEN).astype(np.int64)
    else:
        inputs["pixel_values"] = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    if name == "gemma3":
        inputs["token_type_ids"] = (ids == IMAGE_TOKEN).astype(np.int64)
    return inputs


def as_numpy(value: Any) -> np.ndarray:
    """A backend's result (a JAX array, a torch tensor on any device, numpy) as a numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def save_tiny(
    config: Any,
    directory: str | Path,
    auto_class: str = "AutoModelForCausalLM",
    seed: int = 0,
    spread: bool = False,
) -> Any:
    """Build ``auto_class`` from ``config`` with seeded random weights, save it to ``directory`` and return the
    reference model loaded back from there (float32, eval mode). ``spread`` draws the weights with
    :func:`spread_weights` instead of transformers' initializers."""
    import torch
    import transformers

    cls = getattr(transformers, auto_class)
    torch.manual_seed(seed)
    model = cls.from_config(config)
    if spread:
        spread_weights(model, seed)
    model.save_pretrained(directory)
    return cls.from_pretrained(directory).eval()


#: The words of :func:`save_tiny_tokenizer`'s vocabulary, after its special tokens ``<pad> <s> </s> <unk> <mask>``.
TINY_WORDS = (
    "the a an of to in is was and or it this that on at by with for from as be are were has have had "
    "capital france paris city country river sea sun moon day night good bad great small big old new "
    "first last one two three four five six seven eight nine ten red blue green black white cat dog "
    "bird fish tree house car road book word name time year people man woman child hand eye head "
    "water fire earth air light dark hot cold up down left right here there what who when where why "
    "how not no yes all some many few more most other such only own same so than too very can will "
    "just should now i you he she we they me him her us them my your his its our their"
).split()


def save_tiny_tokenizer(directory: str | Path, vocab_size: int = 128) -> Any:
    """Save a word-level tokenizer of ``vocab_size`` tokens (pad 0, BOS 1, EOS 2, as :data:`TINY_SPECIAL`)
    with a chat template to ``directory``, beside a tiny checkpoint, and return it loaded back with
    ``AutoTokenizer`` (the Hub is not reachable from tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", "<mask>", *TINY_WORDS][:vocab_size]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    wrapped.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    wrapped.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def tiny_models(
    make_dir: Callable[[str], Any], backend: str
) -> Callable[..., tuple[Path, Any, Any]]:
    """``build(name, auto_class="AutoModelForCausalLM")`` -> ``(checkpoint dir, PyTorch reference, hfax model on
    backend)`` for the tiny config ``name``, each built once. ``make_dir(basename)`` makes a fresh folder
    (pytest's ``tmp_path_factory.mktemp``); use it from a session-scoped fixture. Unless ``HFAX_CACHE`` is set,
    compiled programs go to a fresh folder too, not to the user's cache."""
    import hfax

    os.environ.setdefault("HFAX_CACHE", str(make_dir("hfax-cache")))

    built: dict[tuple[str, str], tuple[Path, Any, Any]] = {}

    def build(name: str, auto_class: str = "AutoModelForCausalLM") -> tuple[Path, Any, Any]:
        if (name, auto_class) not in built:
            directory = Path(make_dir(f"{name}-{auto_class}"))
            reference = save_tiny(tiny_config(name), directory, auto_class)
            model = getattr(hfax, auto_class).from_pretrained(str(directory), backend=backend)
            built[name, auto_class] = directory, reference, model
        return built[name, auto_class]

    return build


def spread_weights(model: Any, seed: int = 0) -> None:
    """Random weights under which a tiny model's next token depends on its context.

    transformers' initializers (std 0.02, zero biases, unit norms) leave a 2-layer model repeating one token
    whatever its cache holds, so a broken cache still passes a generate test. Matrices get unit-scale
    activations (std ``1/sqrt(fan_in)``); vectors (norms, biases, gates) a spread of 0.1 around their values.
    """
    import math

    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.is_floating_point():
                continue
            noise = torch.randn(parameter.shape, generator=generator).to(parameter.dtype)
            if parameter.ndim >= 2:
                parameter.copy_(noise / math.sqrt(parameter.shape[-1]))
            else:
                parameter.add_(noise * 0.1)


def mapped_resident_bytes(path: str | Path) -> int:
    """Resident bytes of this process's mappings of file ``path``, from ``/proc/self/smaps``.

    The load tests check with it that a reader drops the pages of a mapped checkpoint it has
    finished with, which the process's peak memory alone would only show for large files.
    """
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if (
                "-" in fields[0] and len(fields) >= 5
            ):  # a mapping's first line: range, perms, ..., path
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def left_padded(prompts: list[list[int]], pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token lists as one left-padded ``(input_ids, attention_mask)`` batch."""
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad_token_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return ids, mask


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
    import transformers

    config = transformers.ReformerConfig(
        hidden_size=64, num_attention_heads=4, attention_head_size=16, feed_forward_size=128,
        vocab_size=128, attn_layers=["local", "local"], local_attn_chunk_length=4,
        axial_pos_embds_dim=[32, 32], axial_pos_shape=[8, 8], max_position_embeddings=64,
        is_decoder=True, pad_token_id=0,
    )  # fmt: skip
    reference = save_tiny(config, directory, "AutoModelForCausalLM", spread=True)
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


def bert2bert_config(pad_token_id: int) -> Any:
    """A tiny ``EncoderDecoderConfig`` of two BERTs (the decoder with cross-attention), start token 2 and
    end token 3."""
    import transformers

    bert = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=pad_token_id,
    )  # fmt: skip
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.BertConfig(**bert),
        transformers.BertConfig(**bert, is_decoder=True, add_cross_attention=True),
    )
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 2, pad_token_id, 3
    return config


def fsmt_config(pad_token_id: int) -> Any:
    """A tiny ``FSMTConfig`` (English to German), start token 2, end token 2."""
    import transformers

    return transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=64, tgt_vocab_size=64, d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=pad_token_id, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=2, num_beams=1,
    )  # fmt: skip


def prophetnet_config() -> Any:
    """A tiny ``ProphetNetConfig``: two predicting n-gram streams, 8 relative-position buckets."""
    import transformers

    return transformers.ProphetNetConfig(
        vocab_size=64, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
        num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2,
        num_buckets=8, relative_max_distance=16, max_position_embeddings=64,
    )  # fmt: skip


def switch_config(pad_token_id: int) -> Any:
    """A tiny ``SwitchTransformersConfig``: 4 experts in every layer, each taking at most 3 tokens of a
    sequence; start token ``pad_token_id``, end token 1."""
    import transformers

    return transformers.SwitchTransformersConfig(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        num_experts=4, expert_capacity=3, encoder_sparse_step=1, decoder_sparse_step=1,
        relative_attention_num_buckets=8, decoder_start_token_id=pad_token_id,
        pad_token_id=pad_token_id, eos_token_id=1,
    )  # fmt: skip


def led_config(pad_token_id: int) -> Any:
    """A tiny ``LEDConfig`` whose encoder window (4 tokens) is shorter than the sources it is given: start
    and end token 2."""
    import transformers

    return transformers.LEDConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, attention_window=4,
        pad_token_id=pad_token_id, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip


def looping_config(name: str) -> Any:
    """A tiny config of a model whose transformers layers loop in Python over what a batch hits:
    ``"dbrx"`` (``[experts * ffn, hidden]`` weight matrices, a loop over the experts hit),
    ``"longcat_flash"`` (routed experts and identity experts numbered after them), ``"jetmoe"`` (experts
    and a mixture of attention heads, the tokens sorted by expert split by a list of counts), ``"xmod"``
    (language adapters, each row's chosen by its language id and gathered by a boolean mask) or
    ``"qwen4_exp"`` (an indexer choosing each query's keys in a loop)."""
    import transformers

    configs = {
        "dbrx": lambda: transformers.DbrxConfig(
            vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
            ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2},
        ),
        "longcat_flash": lambda: transformers.LongcatFlashConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, num_key_value_heads=4,
            ffn_hidden_size=48, expert_ffn_hidden_size=16, n_routed_experts=4, zero_expert_num=2,
            moe_topk=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
            v_head_dim=8, head_dim=8, max_position_embeddings=64,
        ),
        "jetmoe": lambda: transformers.JetMoeConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
            intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        ),
        "xmod": lambda: transformers.XmodConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, is_decoder=True, languages=["en_XX", "de_DE", "fr_XX"],
            default_language="de_DE",
        ),
        "qwen4_exp": lambda: transformers.Qwen4ExpTextConfig(
            vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
            max_position_embeddings=64, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=4, ple_embed_dim=64,
            layer_types=["linear_attention", "indexed_attention"], indexer_n_heads=4,
            indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
        ),
    }  # fmt: skip
    return configs[name]()


def reference_forward(model: Any, **inputs: Any) -> Any:
    """The PyTorch reference's output for numpy (or torch) inputs, without gradients."""
    import torch

    with torch.no_grad():
        return model(**{name: torch.as_tensor(value) for name, value in inputs.items()})


def reference_generate(
    model: Any, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, **options: Any
) -> np.ndarray:
    """transformers' own ``generate`` on PyTorch/CPU (greedy unless told otherwise), as numpy."""
    import torch

    options.setdefault("do_sample", False)
    mask = None if attention_mask is None else torch.as_tensor(attention_mask)
    with torch.no_grad():
        return model.generate(torch.as_tensor(input_ids), attention_mask=mask, **options).numpy()


def assert_same_continuation(expected: np.ndarray, actual: Any, pad_token_id: int) -> None:
    """hfax returns ``prompt + max_new_tokens`` columns, padded after EOS; transformers stops once every row
    finished. The common columns must match exactly and hfax's extra columns must be padding."""
    actual = as_numpy(actual)
    width = expected.shape[1]
    np.testing.assert_array_equal(actual[:, :width], expected)
    assert (actual[:, width:] == pad_token_id).all(), (
        f"tokens after transformers stopped are not padding: {actual[:, width:]}"
    )


def assert_same_greedy(
    model: Any, reference: Any, prompt: list[int], max_new_tokens: int
) -> np.ndarray:
    """hfax's greedy ``generate`` gives exactly transformers' tokens for ``prompt``, every one of the
    ``max_new_tokens`` (EOS stops neither side). Returns them."""
    ids = np.asarray([prompt], np.int64)
    options = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    expected = reference_generate(reference, ids, **options)
    np.testing.assert_array_equal(
        as_numpy(model.generate(ids, **options)),
        expected,
        err_msg="greedy tokens differ from PyTorch",
    )
    return expected


def assert_same_logits(
    model: Any, reference: Any, prompts: list[list[int]], atol: float = 1e-4
) -> np.ndarray:
    """A forward over ``prompts`` as one left-padded batch: logits finite everywhere, and within ``atol`` of
    transformers' on PyTorch at every real (not padding) position. Returns hfax's logits."""
    import torch

    ids, mask = left_padded(prompts)
    with torch.no_grad():
        expected = (
            reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
            .logits.float()
            .numpy()
        )
    actual = as_numpy(model(input_ids=ids, attention_mask=mask).logits).astype(np.float32)
    assert np.isfinite(actual).all(), (
        f"non-finite logits at (row, position) {np.argwhere(~np.isfinite(actual).all(-1)).tolist()}"
    )
    real = mask.astype(bool)
    np.testing.assert_allclose(
        actual[real], expected[real], atol=atol, rtol=0, err_msg="logits differ from PyTorch"
    )
    return actual
