"""Attention masks over a slot KV cache, written in torch so that every backend builds the same ones.

A slot cache holds ``length`` positions per row; prompt tokens sit left-padded in the first slots and new
tokens follow. transformers accepts a ready 4-D mask (or, for hybrid models, a dict of them by layer type)
and then skips its own mask construction, which reads Python-int lengths off the cache and syncs with the
host (``padding_mask.all()``). The masks are of the type transformers' own mask function for the model's
attention implementation makes: booleans for ``sdpa`` (True where a query may look), else additive (0
there, the dtype's minimum elsewhere, as ``eager`` and hfax's ``hfax_jax`` attention take them). A model
that joins the ready mask to one it builds itself (T5Gemma 2 concatenates its decoder's mask with the
cross-attention mask) needs the two of one type: a float mask joined to a boolean one reads the
booleans as additive 1 and 0, and padding of the source is attended.

Some models read the 2-D padding mask for more than attention: recurrent (Mamba-style, linear-attention)
layers zero the padding positions of their input with it, ALiBi models count their position biases along
it, and models not built on transformers' ``masking_utils`` (OpenAI GPT) expand it themselves. A ready
4-D mask breaks them, so :func:`form` hands them the 2-D mask and they build their attention masks
themselves from the cache's traced write slot.

torch and transformers are imported when a mask or its form is built, never when this module is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: cache layer types holding recurrent state (conv, SSM, linear attention), alone or beside attention.
RECURRENT_LAYER_TYPES = ("conv", "linear_attention", "hybrid", "hybrid_sliding")


@dataclasses.dataclass(frozen=True)
class Span:
    """Which earlier slots a query of one layer type may see, besides padding: ``window`` (sliding attention)
    keeps the last ``window`` positions, ``chunk`` (chunked attention, Llama 4) only those of the query's own
    chunk of ``chunk`` positions (counted from the row's first real token); neither = full causal attention.

    ``cached_only`` bounds by ``window`` only the keys cached before the forward, as transformers' sliding
    cache does under a model whose own masks have no window (Moshi, :func:`cache_only_window`): a prefill
    sees its whole prompt, each later token the last ``window`` positions (``window - 1`` kept and itself).
    """

    window: int | None = None
    chunk: int | None = None
    cached_only: bool = False


@dataclasses.dataclass(frozen=True)
class MaskForm:
    """How a model gets its ``attention_mask`` (hashable: part of a compiled program's static structure).

    ``spans`` is ``((layer type, Span), ...)``; ``two_d`` says the model takes the 2-D padding mask and
    builds its attention masks itself; ``boolean`` that its ready masks are booleans, not additive.
    """

    spans: tuple[tuple[str, Span], ...]
    two_d: bool = False
    boolean: bool = False


def layer_windows(config: Any) -> dict[str, int | None]:
    """The sliding window of each attention layer type of ``config`` (``None`` = full attention)."""
    return {kind: span.window for kind, span in layer_spans(config).items()}


def layer_spans(config: Any) -> dict[str, Span]:
    """The :class:`Span` of each attention layer type the decoder of ``config`` names in ``layer_types``."""
    config = config.get_text_config(
        decoder=True
    )  # a multimodal model's decoder keeps its windows in its text config
    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    types = set(getattr(config, "layer_types", None) or ())
    if not types:
        if chunk is not None and window is None:
            return {"chunked_attention": Span(chunk=chunk)}
        return {"full_attention": Span(window=window)}
    spans = {}
    for kind in types:
        if kind in ("sliding_attention", "hybrid_sliding"):
            spans[kind] = Span(window=window)
        elif kind == "chunked_attention":
            spans[kind] = Span(chunk=chunk)
        else:
            spans[kind] = Span()
    return spans


def form(config: Any, module: Any = None) -> MaskForm:
    """How a transformers model takes its attention mask (``module``, when given, is the model itself).

    The 2-D mask goes to models with recurrent layers (by transformers' ``get_layer_types_and_kwargs``), to
    ALiBi models (``config.alibi``, MPT's ``attn_config.alibi``, or a model that builds its ALiBi tensor
    itself, as BLOOM does) and to models whose code does not use transformers' mask functions, which are
    what accept a ready 4-D mask.
    """
    spans = tuple(sorted(layer_spans(config).items()))
    if module is not None and cache_only_window(module) is not None:
        spans = tuple((kind, dataclasses.replace(span, cached_only=True)) for kind, span in spans)
    two_d = (
        has_recurrent_layers(config)
        or _uses_alibi(config, module)
        or not _uses_masking_utils(module)
    )
    # transformers' sdpa_mask makes booleans; eager_mask (eager, hfax_jax) additive masks.
    boolean = getattr(config.get_text_config(decoder=True), "_attn_implementation", None) == "sdpa"
    return MaskForm(spans, two_d=two_d, boolean=boolean)


def cache_only_window(module: Any) -> int | None:
    """The sliding window transformers' dynamic cache applies to ``module`` while its attention masks
    ignore it (Moshi): a config with ``sliding_window`` and no ``layer_types`` gets sliding cache layers,
    yet the model's code builds its mask with ``create_causal_mask`` only. ``None`` for every other model."""
    import sys

    config = module.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or getattr(config, "layer_types", None):
        return None
    for cls in type(module).__mro__:
        if cls.__module__.startswith("transformers.models."):
            namespace = vars(sys.modules[cls.__module__])
            windowed = ("create_sliding_window_causal_mask", "create_masks_for_generate")
            if "create_causal_mask" in namespace and not any(
                name in namespace for name in windowed
            ):
                return window
            return None
    return None


def has_recurrent_layers(config: Any) -> bool:
    """Whether some layer of ``config``'s decoder keeps recurrent (conv, SSM, linear-attention) state."""
    from transformers import cache_utils

    try:
        types, _ = cache_utils.get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except (
        AttributeError,
        TypeError,
        ValueError,
    ):  # configs without per-layer information: attention only
        return False
    return any(kind in RECURRENT_LAYER_TYPES for kind in types)


def _uses_alibi(config: Any, module: Any) -> bool:
    attn_config = getattr(config, "attn_config", None)
    if getattr(config, "alibi", False) or getattr(attn_config, "alibi", False):
        return True
    base = getattr(module, "base_model", module)
    return base is not None and any(
        name.startswith("build_") and "alibi" in name for name in dir(type(base))
    )


#: transformers' mask functions (``masking_utils``); each returns a ready 4-D mask as it is.
_MASK_FUNCTIONS = (
    "create_causal_mask",
    "create_sliding_window_causal_mask",
    "create_chunked_causal_mask",
    "create_masks_for_generate",
    "create_bidirectional_mask",
)


def _uses_masking_utils(module: Any) -> bool:
    if module is None:
        return True
    import sys

    for cls in type(module).__mro__:
        if cls.__module__.startswith("transformers.models."):
            namespace = vars(sys.modules[cls.__module__])
            return any(name in namespace for name in _MASK_FUNCTIONS)
    return True  # not a transformers model class: assume it follows transformers' conventions


def attention_mask(
    mask_form: MaskForm, valid: Any, query_slots: Any, dtype: Any, blocks: Any = None
) -> Any:
    """The ``attention_mask`` argument for a forward whose queries sit at ``query_slots`` (shape ``[q]``).

    ``valid`` is a ``[batch, length]`` bool tensor: True where a slot holds a real (not padding) token. Under
    a 2-D form that is the mask (as integers, as transformers takes it); otherwise see :func:`build`.
    """
    if mask_form.two_d:
        return valid.long()
    if mask_form.boolean:
        dtype = None
    return build(dict(mask_form.spans), valid, query_slots, dtype, blocks)


def block_ids(module: Any) -> Any:
    """The function of ``module``'s modeling file that numbers its images' token blocks from
    ``token_type_ids`` (Gemma 3's ``get_block_sequence_ids_for_mask``: an image's tokens see each other),
    or ``None``."""
    import sys

    namespace = sys.modules.get(type(module).__module__)
    return getattr(namespace, "get_block_sequence_ids_for_mask", None)


def build(
    spans: dict[str, Span | int | None],
    valid: Any,
    query_slots: Any,
    dtype: Any,
    blocks: Any = None,
) -> Any:
    """Additive masks (booleans for ``dtype`` ``None``) for a forward whose queries sit at
    ``query_slots`` (shape ``[q]``).

    ``spans`` maps layer types to a :class:`Span` (or a sliding window, ``None`` = full attention).
    ``valid`` is a ``[batch, length]`` bool tensor: True where a slot holds a real (not padding) token.
    ``blocks`` (``[batch, length]``, or ``None``) numbers blocks of slots whose tokens all see each other
    (an image's, as transformers' ``block_sequence_ids``; -1 outside any): within the window, as causal.
    Returns one ``[batch, 1, q, length]`` mask of ``dtype``, or a dict by layer type when the model mixes
    types. Runs on any torch device (XLA, torchax's JAX tensors, CPU).
    """
    import torch

    slots = torch.arange(valid.shape[1], device=valid.device)
    keys, queries = slots[None, :], query_slots[:, None]
    causal = keys <= queries
    if blocks is not None:  # numbered over the prompt; slots after it (the new tokens) are in none
        blocks = torch.nn.functional.pad(blocks, (0, valid.shape[1] - blocks.shape[1]), value=-1)
        query_blocks = blocks[:, query_slots]
        same = (query_blocks[:, :, None] == blocks[:, None, :]) & (query_blocks >= 0)[:, :, None]
        causal = (causal[None] | same)[:, None]  # [batch, 1, q, length]
    blocked = (
        None
        if dtype is None
        else torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=valid.device)
    )
    masks = {}
    for kind, span in spans.items():
        span = span if isinstance(span, Span) else Span(window=span)
        allowed = causal
        if span.window is not None:
            # cached_only: the window counts back from the forward's first query (the cache it found)
            first = query_slots[:1, None] if span.cached_only else queries
            allowed = allowed & (keys > first - span.window)
        allowed = (allowed if blocks is not None else allowed[None, None]) & valid[:, None, None, :]
        if span.chunk is not None:  # by position, which left padding shifts against the slot
            positions = torch.div(
                torch.cumsum(valid.long(), dim=1) - 1, span.chunk, rounding_mode="floor"
            )
            allowed = allowed & (
                positions[:, None, query_slots, None] == positions[:, None, None, :]
            )
        masks[kind] = (
            allowed
            if blocked is None
            else torch.where(allowed, torch.zeros((), dtype=dtype, device=valid.device), blocked)
        )
    return masks if len(masks) > 1 else next(iter(masks.values()))
