"""Tiny checkpoints on disk: a model of a tiny config with seeded random weights, saved and loaded back through
``from_pretrained`` so the real loading code runs, and a word-level or byte-level tokenizer to save beside
it.

They need torch (any backend brings it); it is imported when they run, so the torch_xla environment's
torch 2.9 serves as well as the JAX backend's 2.13.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from hfax.testing.configs import tiny_config


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


#: The special tokens every tiny tokenizer starts with (pad 0, BOS 1, EOS 2, as :data:`TINY_SPECIAL`).
_SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


def save_tiny_tokenizer(directory: str | Path, vocab_size: int = 128) -> Any:
    """Save a word-level tokenizer of ``vocab_size`` tokens (pad 0, BOS 1, EOS 2, as :data:`TINY_SPECIAL`)
    with a chat template to ``directory``, beside a tiny checkpoint, and return it loaded back with
    ``AutoTokenizer`` (the Hub is not reachable from tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = [*_SPECIAL, *TINY_WORDS][:vocab_size]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return _save_tokenizer(tokenizer, directory)


def save_tiny_byte_tokenizer(directory: str | Path) -> Any:
    """Save a byte-level tokenizer to ``directory`` and return it loaded back: the special tokens of
    :func:`save_tiny_tokenizer`, then one token per byte (GPT-2's byte-level alphabet) and no merges, 261
    tokens. Any text round-trips through it and a token's text is its bytes, which grammar-constrained
    decoding needs (llguidance reads byte-level tokenizers; the word-level one above joins its words with
    spaces), and a model on it can spell any output, JSON included."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*_SPECIAL, *alphabet])}
    tokenizer = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return _save_tokenizer(tokenizer, directory)


def _save_tokenizer(tokenizer: Any, directory: str | Path) -> Any:
    """``tokenizer`` (a ``tokenizers.Tokenizer`` starting with :data:`_SPECIAL`) with BOS before every
    text and a plain chat template, saved as a transformers tokenizer and loaded back."""
    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

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
