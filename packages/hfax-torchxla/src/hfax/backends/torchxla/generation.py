"""The PyTorch/XLA backend's generation engine: a fixed set of XLA programs per shape bucket.

hfax-core's driver (:mod:`hfax.generation.driver`) settles a request and calls :class:`TorchXlaEngine`.

* Shapes are bucketed by the core (rows and prompt and new-token counts to powers of two); prompts are
  left-padded into their bucket and the padding is masked, so a padded prompt produces the tokens it
  produces alone.
* The KV cache is transformers' own ``StaticLayer`` for every attention layer, full length (a sliding
  window is applied by the mask, never by slicing): buffers written in place at a tensor position; a
  recurrent (mamba, linear-attention) layer's fixed-size states are transformers' ``LinearAttentionLayer``,
  which also writes in place, and prefill hands such a model the prompt's 2-D mask. An
  encoder-decoder's is transformers' ``EncoderDecoderCache``: ``StaticLayer`` self-attention, and
  cross-attention layers as long as the encoder's output, filled once in prefill and read after. The mask
  comes from :func:`hfax.masks.attention_mask` under the model's mask form: ready 4-D masks (sliding and chunked
  spans), or the 2-D padding mask for models that build theirs themselves (ALiBi, recurrent layers).
* Prefill runs once per call as one lazy-tensor graph, with the first token's choice (one compilation per
  bucket, then a cache hit; an encoder-decoder's encoder runs in it, on text ids or audio features); the
  decode step goes through the ``hfax_compile_step`` hook
  (``torch.compile(backend="openxla")``): dynamo traces it once per bucket and every later token runs the
  cached program without re-tracing Python. The token choice in both is hfax-core's torch code
  (:mod:`hfax.generation.tokens`); beam search reorders the cache's rows by the indices it returns.
* The host syncs once per ``STREAM_CHUNK`` tokens, to stop when every row finished. A step after that
  leaves the token state as it is, so the state read back is the one the core's loop condition stops at.
* On CPU, a batched call of :data:`linear.TRANSPOSE_FROM_STEPS` new tokens or more multiplies by an
  ``[in, out]`` copy of every ``nn.Linear`` weight, made once per call (:mod:`hfax.backends.torchxla.linear`).
* Compiled programs cost host memory that is never given back (on CPU, each maps its code, and enough of
  them exhaust ``vm.max_map_count``: the process dies in LLVM; the package README has the count). A process-wide
  compile budget (``HFAX_TORCHXLA_COMPILE_BUDGET`` programs) bounds them: past it, a request runs in the
  smallest bucket already compiled that holds it, or fails with an error that says so.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch
import torch_xla
from transformers import cache_utils
from transformers.cache_utils import Cache, EncoderDecoderCache, StaticLayer

from hfax import masks
from hfax.backends.torchxla import linear, runtime
from hfax.generation import driver, layer_outputs, shapes, tokens
from hfax.generation import inputs as model_inputs
from hfax.generation.shapes import STREAM_CHUNK, accepts
from hfax.generation.traits import Appended, generation_traits

#: XLA programs a process may compile before generate stops adding buckets (see the module docstring).
DEFAULT_COMPILE_BUDGET = 48
#: Programs one new bucket costs: prefill with the first token's choice, and the decode step.
PROGRAMS_PER_BUCKET = 3


class CompileBudgetError(RuntimeError):
    """A request needs a new shape bucket, the process's compile budget is spent, and no bucket holds it."""


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The shapes and structure that fix one prefill program and one decode program: rows, the prompt's
    and the new tokens' widths (``decoding.prompt``, ``decoding.capacity``) and the loop's structure."""

    batch: int
    decoding: tokens.Decoding
    positions: bool  # whether positions come from the mask (else a prompt keeps its own width)
    source: tuple[tuple[str, tuple[int, ...]], ...] = ()  # an encoder's inputs: names and shapes

    def holds(self, other: Bucket) -> bool:
        mine, theirs = self.decoding, other.decoding
        widths = dict(prompt=0, capacity=0)
        same = (self.batch, self.positions, self.source) == (
            other.batch,
            other.positions,
            other.source,
        ) and dataclasses.replace(mine, **widths) == dataclasses.replace(theirs, **widths)
        prompt_fits = (
            mine.prompt >= theirs.prompt if self.positions else mine.prompt == theirs.prompt
        )
        return same and prompt_fits and mine.capacity >= theirs.capacity


def compile_budget() -> int:
    """``HFAX_TORCHXLA_COMPILE_BUDGET`` or :data:`DEFAULT_COMPILE_BUDGET`."""
    raw = os.environ.get("HFAX_TORCHXLA_COMPILE_BUDGET", "")
    try:
        return int(raw) if raw else DEFAULT_COMPILE_BUDGET
    except ValueError:
        raise ValueError(
            f"HFAX_TORCHXLA_COMPILE_BUDGET must be an integer number of programs, got {raw!r}"
        ) from None


def choose_bucket(compiled: set[Bucket], wanted: Bucket) -> Bucket:
    """``wanted`` if compiled or affordable, else the smallest compiled bucket that holds it."""
    if wanted in compiled or runtime.counters().compiles + PROGRAMS_PER_BUCKET <= compile_budget():
        return wanted
    holding = [b for b in compiled if b.holds(wanted)]
    if holding:
        return min(
            holding,
            key=lambda b: (b.decoding.prompt + b.decoding.capacity, b.decoding.prompt),
        )
    decoding = wanted.decoding
    raise CompileBudgetError(
        f"this process compiled {runtime.counters().compiles} XLA programs, its budget is {compile_budget()}, "
        f"and no compiled bucket holds batch {wanted.batch}, prompt {decoding.prompt}, {decoding.capacity} new "
        "tokens with these generation settings. Each program keeps host memory (on CPU the process dies in "
        "LLVM after about 70 programs of a 134M model), so hfax stops here. Warm the largest bucket first (a "
        "long prompt and max_new_tokens) so later requests fit in it, or raise HFAX_TORCHXLA_COMPILE_BUDGET "
        "if the host has room."
    )


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything about one bucket's programs that is not a tensor (hashable; dynamo guards on it)."""

    decoding: tokens.Decoding
    mask_form: masks.MaskForm
    pass_positions: bool
    logits_to_keep: bool
    encoder_decoder: bool = False
    # the forward's cache parameter, whatever the release calls it (shapes.cache_argument); "" for none
    cache_argument: str = "cache"
    attends: bool = (
        True  # some layer attends over past tokens (a purely recurrent one decodes unmasked)
    )
    appended: Appended | None = None  # a token after the tokens so far at every step


#: Seconds spent tracing new buckets' decode steps in this process (XLA's compile time excluded).
_trace_seconds = [0.0]

#: One object per distinct :class:`Static`, so that dynamo's guards on it hold from call to call.
_STATICS: dict[Static, Static] = {}


def _logits(
    module: Any,
    cache: Cache | None,
    ids: Any,
    positions: Any,
    valid: Any,
    query_slots: Any,
    static: Static,
    inputs: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    at: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """One forward over ``ids`` written at ``query_slots`` of the cache; the last position's logits, or
    position ``at``'s (``[1]``: a model without a cache reads the whole sequence), and the per-layer
    outputs the decoding records (:mod:`hfax.generation.layer_outputs`; ``{}`` when it records none).
    ``inputs`` are the model's other inputs (images, ...: prefill only); ``source`` an encoder-decoder's
    encoder output (``encoded``) and the encoder's padding mask (``mask``, absent for features)."""
    inputs = inputs or {}
    blocks = None
    if "token_type_ids" in inputs and (number := masks.block_ids(module)) is not None:
        blocks = number(inputs["token_type_ids"])  # an image's tokens see each other (Gemma 3)
    mask = (
        None
        if valid is None
        else masks.attention_mask(static.mask_form, valid, query_slots, module.dtype, blocks)
    )
    kwargs: dict[str, Any] = {}
    if static.cache_argument:
        kwargs.update({static.cache_argument: cache, "use_cache": True})
    elif accepts(module, "use_cache"):
        # Decoding without a cache: a model that keeps state in itself (RecurrentGemma) must not either.
        kwargs["use_cache"] = False
    if source is None:
        kwargs.update(input_ids=ids.to(torch.int64), attention_mask=mask)
    else:  # the decoder's ids against the encoder's output; its cross-attention reads the cache after prefill
        kwargs.update(
            decoder_input_ids=ids.to(torch.int64),
            decoder_attention_mask=mask,
            encoder_outputs=source["encoded"],
        )
        if "mask" in source:
            kwargs["attention_mask"] = source["mask"]
    if static.pass_positions:
        kwargs["position_ids"] = positions
    if static.appended is not None and static.appended.lang is not None:
        kwargs["langs"] = torch.full_like(kwargs["input_ids"], static.appended.lang)
    if static.logits_to_keep and at is None:
        kwargs["logits_to_keep"] = 1
    kwargs.update(inputs)  # multimodal positions replace the plain ones
    if "inputs_embeds" in inputs:  # the prompt as embeddings, in the weights' dtype
        del kwargs["input_ids"]
        kwargs["inputs_embeds"] = inputs["inputs_embeds"].to(module.dtype)
    asked = layer_outputs.flags(static.decoding, module)
    kwargs.update(asked)
    output = module(**kwargs)
    logits = output.logits
    recorded = {
        name: layer_outputs.stacked(getattr(output, name))
        for name, flag in layer_outputs.ASKED_BY.items()
        if flag in asked
    }
    return logits[:, -1, :] if at is None else logits.index_select(1, at)[:, 0, :], recorded


def prefill(
    module: Any,
    cache: Cache,
    ids: Any,
    prompt_mask: Any,
    valid: Any,
    arrays: Any,
    static: Static,
    inputs: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the prompt (and the model's other ``inputs``: its images run through their encoder here),
    fill the cache, choose the first new token: the token state after the prompt.

    An encoder-decoder's ``source`` is the encoder's output and mask (:func:`encode`); the decoder's
    cross-attention layers fill their part of the cache from it here."""
    length = ids.shape[1]
    positions = torch.where(prompt_mask, prompt_mask.long().cumsum(1) - 1, 1)
    query_slots = torch.arange(length, device=ids.device)
    if not static.cache_argument or (
        static.mask_form.two_d and masks.has_recurrent_layers(module.config)
    ):
        # A model without a cache attends over the prompt alone. Recurrent layers zero their input's padding with the last `length` columns of a 2-D mask, so it
        # is the prompt's, as transformers' generate passes it (its attention layers read it as masking
        # the empty slots after the prompt).
        valid = prompt_mask
    read = ids
    if static.appended is not None:
        # The prompt and the appended token, whose logits choose the first new token.
        read = torch.cat([ids, torch.full_like(ids[:, :1], static.appended.token)], 1)
        valid = torch.cat([prompt_mask, torch.ones_like(prompt_mask[:, :1])], 1)
        positions = torch.where(valid, valid.long().cumsum(1) - 1, 1)
        query_slots = torch.arange(length + 1, device=ids.device)
    logits, recorded = _logits(
        module, cache, read, positions, valid, query_slots, static, inputs, source
    )
    chosen = tokens.start(ids, prompt_mask, logits, static.decoding, arrays)
    # The per-layer outputs asked for travel with the token state, which the driver reads.
    return {**chosen, **layer_outputs.start(recorded, static.decoding.capacity)}


def encode(module: Any, source: dict[str, Any]) -> dict[str, Any]:
    """An encoder-decoder's encoder run once on its inputs by name (text ids and mask, or audio
    features, or text and images: :func:`hfax.generation.inputs.encode`): ``{"encoded": output, "mask":
    mask}`` as the decoder's steps take them. The encoder runs alone, as in transformers' ``generate``, and
    its own output type reaches the decoder."""
    encoded = model_inputs.encode(module, source)
    mask = source.get("attention_mask")
    return {"encoded": encoded} if mask is None else {"encoded": encoded, "mask": mask}


def decode_step(
    module: Any,
    cache: Cache,
    chosen: dict[str, Any],
    valid: Any,
    seen: Any,
    limit: Any,
    arrays: Any,
    static: Static,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Choose the next token of every row: the program compiled once per bucket.

    ``chosen`` is the token state (:mod:`hfax.generation.tokens`), ``valid`` ``[rows, prompt + capacity]``
    which cache slots hold real tokens, ``seen`` the real prompt tokens per row, ``limit`` (``[1]``) the new
    tokens the run may reach, ``source`` an encoder-decoder's encoder output (:func:`encode`). Once the
    loop condition fails the state stays as it is. Everything is a tensor, so the step has no Python value
    that changes from one token to the next.
    """
    decoding = static.decoding
    step = chosen["step"]
    rows = valid.shape[0]
    last = tokens.last_tokens(chosen, decoding)
    slot = (decoding.prompt + step - 1).view(1)
    if static.cache_argument:
        positions = (seen + step - 1).view(rows, 1)
        # A purely recurrent model decodes without a mask, as transformers' generate drops it after the
        # prompt: Mamba multiplies its one token's input by the whole 2-D mask, broadcasting it to every slot.
        logits, recorded = _logits(
            module,
            cache,
            last,
            positions,
            valid if static.attends else None,
            slot,
            static,
            source=source,
        )
    else:  # the prompt and the tokens so far, the rest masked; the logits of the last token so far
        slots = torch.arange(valid.shape[1], device=valid.device)
        ids, last = chosen["ids"], slot
        if static.appended is not None:
            # Or of the token appended after them (the buffer has room: the loop ends a slot before).
            last = slot + 1
            ids = torch.where(slots == last, static.appended.token, ids)
        so_far = valid & (slots <= last)[None]
        positions = torch.where(so_far, so_far.long().cumsum(1) - 1, 1)
        logits, recorded = _logits(
            module, None, ids, positions, so_far, slots, static, source=source, at=last
        )
    going = tokens.running(chosen, limit.reshape(()))
    advanced, reorder = tokens.advance(chosen, logits, decoding, arrays)
    advanced = layer_outputs.write(advanced, recorded, step)
    if (
        reorder is not None and cache is not None
    ):  # beams: every row's cache follows the beam it extends
        order = reorder.to(torch.int64)
        for layer in _self_attention(cache).layers:
            for tensor in _rows(layer):
                tensor.copy_(tensor.index_select(0, order))
    return {name: torch.where(going, value, chosen[name]) for name, value in advanced.items()}


def _layers(cache: Cache) -> list[Any]:
    """Every layer of the cache, an encoder-decoder's cross-attention layers included."""
    if isinstance(cache, EncoderDecoderCache):
        return [*cache.self_attention_cache.layers, *cache.cross_attention_cache.layers]
    return list(cache.layers)


def _self_attention(cache: Cache) -> Cache:
    """The cache's part that follows the decoded tokens. An encoder-decoder's cross-attention part is
    the same for every beam of a prompt (their sources are copies), so beams never reorder it."""
    return cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache


#: transformers' cache layer types this engine holds: attention keys and values in a full-length
#: ``StaticLayer`` (a window or chunk is applied by the mask, never by slicing); the fixed-size conv and
#: recurrent states of linear-attention (mamba) layers in transformers' ``LinearAttentionLayer``, which
#: writes them in place; both for a hybrid layer; an indexed-attention layer's indexer keys beside its
#: keys and values in transformers' ``StaticIndexedLayer`` (GLM-5, DeepSeek V3.2: its top-k over the whole
#: buffer is static, the mask hides the empty slots). A ``"dummy"`` layer (one that keeps nothing: an MLP
#: or expert layer of Nemotron-H, a layer reading another layer's keys and values in Gemma 3n) gets
#: transformers' ``DummyLayer``, as in its static cache: transformers sizes masks and counts cached tokens
#: on the first layer that is none of dummy, linear or sliding, so an unused ``StaticLayer`` there would
#: read as an empty cache.
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "dummy"})
INDEXED_KINDS = frozenset({"indexed_attention"})
RECURRENT_KINDS = frozenset({"conv", "linear_attention"})
HYBRID_KINDS = frozenset({"hybrid", "hybrid_sliding"})


def _cache_kinds(config: Any) -> list[tuple[str, dict[str, Any]]]:
    """transformers' cache layer type of every decoder layer of ``config``, with its layer's options
    (the number of conv and recurrent states); none for a config that does not say."""
    try:
        kinds, options = cache_utils.get_layer_types_and_kwargs(
            config.get_text_config(decoder=True)
        )
    except Exception:  # noqa: BLE001 - configs without per-layer information
        return []
    return list(zip(kinds, options))


def _cache(config: Any, length: int, encoder_decoder: bool = False) -> Cache:
    """The decoder's cache layers (see :data:`ATTENTION_KINDS`), made before the forward: a model that
    builds its masks itself (from the 2-D mask) reads their length off the cache before the first layer
    runs. An encoder-decoder's cross-attention layers take the encoder's output length when prefill
    writes them."""
    text = config.get_text_config(decoder=True)
    # T5's decoder depth is num_decoder_layers; other encoder-decoders map theirs to num_hidden_layers.
    count = getattr(text, "num_decoder_layers", None) or text.num_hidden_layers
    kinds = _cache_kinds(config)
    if len(kinds) != count:
        kinds = [("full_attention", {})] * count
    decoder = _Cache(layers=[_layer(kind, options, length) for kind, options in kinds])
    if not encoder_decoder:
        return decoder
    return EncoderDecoderCache(decoder, _Cache(layers=[_CrossLayer() for _ in range(count)]))


class _Cache(Cache):
    """transformers' ``Cache``, whose count of cached tokens is a value of its own, as the Python int of
    transformers' dynamic cache is:

    - a copy: a ``StaticLayer``'s count is its ``cumulative_length`` tensor, which its ``update`` then adds
      to in place, so a count read before the update (Inkling's query positions) would move with it;
    - ``int32``: added to an ``int32`` tensor (M2M-100's, NLLB's, SeamlessM4T's positions from the ids), a
      0-d ``int64`` count makes torch_xla 2.9's dynamo bridge build a binary op of ``s64`` and ``s32``, which
      XLA rejects. A 0-d tensor does not change a dimensioned tensor's integer type either way."""

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        length = super().get_seq_length(layer_idx)
        return length.to(torch.int32) if isinstance(length, torch.Tensor) else length


def _attends(config: Any) -> bool:
    """Whether some decoder layer of ``config`` attends over past tokens (keeps keys and values)."""
    kinds = {kind for kind, _ in _cache_kinds(config)}
    return not kinds or bool(kinds - RECURRENT_KINDS)


def _layer(kind: str, options: dict[str, Any], length: int) -> Any:
    states = options.get("number_of_states", 1)
    if kind in RECURRENT_KINDS:
        return cache_utils.LinearAttentionLayer(number_of_states=states)
    if kind in HYBRID_KINDS:
        return cache_utils.LinearAttentionAndStaticFullAttentionLayer(
            length, number_of_states=states
        )
    if kind in INDEXED_KINDS:
        return cache_utils.StaticIndexedLayer(length)
    if kind == "dummy":
        return cache_utils.DummyLayer()
    return StaticLayer(length)


def _rows(layer: Any) -> list[torch.Tensor]:
    """The tensors with a row per sequence that a cache layer holds across steps (keys and values, conv
    and recurrent states): what a beam reorder permutes."""
    tensors = []
    if isinstance(layer, StaticLayer) and layer.is_initialized:
        tensors += [layer.keys, layer.values]
    if getattr(layer, "is_indexer_initialized", False):
        tensors.append(layer.indexer_keys)
    if isinstance(layer, cache_utils.LinearAttentionCacheLayerMixin):
        for kind in ("conv", "recurrent"):
            initialized = getattr(layer, f"is_{kind}_states_initialized")
            tensors += [t for i, t in getattr(layer, f"{kind}_states").items() if initialized[i]]
    return tensors


class _CrossLayer(StaticLayer):
    """A cross-attention layer: as long as the encoder's output, written once by prefill."""

    def __init__(self) -> None:
        super().__init__(max_cache_len=0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.max_cache_len = key_states.shape[-2]
        super().lazy_initialization(key_states, value_states)


def _on_device(tree: Any, device: Any) -> Any:
    """The host arrays of ``tree`` (dicts, lists, numpy) as tensors on ``device``.

    A 0-d array goes as one element viewed as 0-d (materialized by the prefill's ``torch_xla.sync``):
    torch_xla gives 0-d host tensors of equal value one device buffer, and its dynamo bridge binds a
    compiled step's inputs to the buffers it saw when it traced. A later call whose scalars differ ran
    with the traced call's values: a beam search whose prompt width differed from its first call's read
    the first width and never stopped, and a first call whose width equalled its limit fused the two."""
    if isinstance(tree, dict):
        return {name: _on_device(value, device) for name, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_on_device(value, device) for value in tree)
    array = np.array(tree)
    if array.ndim == 0:
        return torch.from_numpy(array.reshape(1)).to(device).view(())
    return torch.from_numpy(array).to(device)


@dataclasses.dataclass
class Run:
    """One ``generate`` call on device: its bucket, cache, settings and token state."""

    static: Static
    grow: int  # columns of left padding added to the prompt's bucket (a larger bucket was chosen)
    cache: Cache
    valid: Any
    seen: Any
    arrays: Any
    chosen: dict[str, Any]
    weights: dict[torch.nn.Linear, torch.Tensor]
    new_bucket: bool  # the bucket's decode step has not been traced yet
    source: dict[str, Any] | None  # an encoder-decoder's encoder output and mask (:func:`encode`)
    steps: int = 1  # decode steps called so far (the prompt chose the first token)


class TorchXlaEngine:
    """:class:`hfax.generation.driver.Engine` for a :class:`~hfax.backends.torchxla.model.TorchXlaModel`.

    An encoder-decoder's encoder runs in the prefill graph; the decode step reads its output and the
    cross-attention cache prefill filled.
    """

    features = frozenset(
        {"beams", "encoder_decoder", "cache_output", "layer_outputs", "host_choice"}
    )
    row_multiple = 1

    def __init__(self, model: Any) -> None:
        self.model = model

    def start(self, padded: driver.PaddedRequest) -> Run:
        model = self.model
        handled = ATTENTION_KINDS | RECURRENT_KINDS | HYBRID_KINDS | INDEXED_KINDS
        other = sorted({kind for kind, _ in _cache_kinds(model.config)} - handled)
        if other:
            raise NotImplementedError(
                f"{type(model.module).__name__}'s cache has {', '.join(map(repr, other))} layers, and hfax's "
                "generate on torch_xla keeps attention keys and values, indexer keys and linear-attention states only: use "
                "backend='jax' (its slot cache carries these layers), or transformers' own generate"
            )
        ids, mask = padded.ids, padded.mask
        source_shapes = tuple(sorted((n, v.shape) for n, v in (padded.source or {}).items()))
        wanted = Bucket(ids.shape[0], padded.decoding, padded.positions, source_shapes)
        chosen = choose_bucket(model.buckets, wanted)
        new_bucket = chosen not in model.buckets
        model.buckets.add(chosen)
        decoding = chosen.decoding
        length = decoding.prompt + decoding.capacity
        cache_argument = shapes.cache_argument(model.module, length)
        grow = (
            decoding.prompt - ids.shape[1]
        )  # a larger bucket: more left padding, masked like the rest
        filler = padded.arrays["filler"]
        ids = np.pad(ids, ((0, 0), (grow, 0)), constant_values=filler)
        mask = np.pad(mask, ((0, 0), (grow, 0)))
        valid = np.concatenate([mask, np.ones((ids.shape[0], decoding.capacity), bool)], 1)
        static = Static(
            decoding=decoding,
            mask_form=masks.form(model.config, model.module),
            pass_positions=padded.positions,
            logits_to_keep=accepts(model.module, "logits_to_keep"),
            encoder_decoder=padded.source is not None,
            cache_argument=cache_argument,
            attends=_attends(model.config),
            appended=None
            if padded.source is not None
            else generation_traits(model.module).appended,
        )
        static = _STATICS.setdefault(static, static)
        layer_outputs.check_recordable(
            static.decoding,
            bool(static.cache_argument) and static.appended is None,
            "on torch_xla an encoder-decoder's encoder runs apart from the decoder's steps"
            if static.encoder_decoder
            else None,
        )
        device = runtime.device()
        arrays = _on_device(padded.arrays, device)
        cache = (
            _cache(model.config, valid.shape[1], static.encoder_decoder) if cache_argument else None
        )
        weights = {}
        if linear.wanted(runtime.platform(), model.mesh, ids.shape[0], decoding.capacity):
            weights = linear.copies(model.module)
        on_device = _on_device({"ids": ids.astype(np.int64), "mask": mask, "valid": valid}, device)
        inputs = _on_device(_grown_inputs(padded, grow), device)
        source = None
        with torch.no_grad(), linear.held(weights):
            if padded.source is not None:
                source = encode(model.module, _on_device(padded.source, device))
            chosen_tokens = prefill(
                model.module,
                cache,
                on_device["ids"],
                on_device["mask"],
                on_device["valid"],
                arrays,
                static,
                inputs,
                source,
            )
            seen = on_device["mask"].sum(1)
            if (
                padded.offsets is not None
            ):  # multimodal positions: later tokens' positions move by them
                seen = seen + _on_device(padded.offsets.astype(np.int64), device)
            torch_xla.sync()  # prefill is one graph; the decode steps start from materialized tensors
        for layer in _layers(cache) if cache is not None else []:
            # transformers marks the buffers as static addresses for CUDA graphs; dynamo would then guard the
            # step on their identity and trace it again for every call's fresh buffers (and keep them alive).
            written = isinstance(layer, StaticLayer) and layer.is_initialized
            length = [layer.cumulative_length] if written else []
            if getattr(layer, "is_indexer_initialized", False):
                length.append(layer.indexer_cumulative_length)
            for tensor in _rows(layer) + length:
                torch._dynamo.mark_static_address(tensor, guard=False)
        return Run(
            static,
            grow,
            cache,
            on_device["valid"],
            seen,
            arrays,
            chosen_tokens,
            weights,
            new_bucket,
            source,
        )

    def advance(self, run: Run, limit: int) -> Run:
        model = self.model
        step_program = model.program("decode", decode_step)
        # one element, not a 0-d host tensor (see _on_device); the step views it as 0-d
        limit_tensor = torch.tensor([limit], dtype=torch.int32).to(runtime.device())
        with torch.no_grad(), linear.held(run.weights):
            while run.steps < limit:
                for _ in range(min(STREAM_CHUNK, limit - run.steps)):
                    traced = run.new_bucket
                    started, compiling = time.perf_counter(), runtime.counters().compile_seconds
                    run.chosen = step_program(
                        model.module,
                        run.cache,
                        run.chosen,
                        run.valid,
                        run.seen,
                        limit_tensor,
                        run.arrays,
                        run.static,
                        run.source,
                    )
                    run.steps += 1
                    if (
                        traced
                    ):  # dynamo traced the step: its time counts as compiling, as XLA's does
                        run.chosen["step"].cpu()
                        _trace_seconds[0] += time.perf_counter() - started
                        _trace_seconds[0] -= runtime.counters().compile_seconds - compiling
                        run.new_bucket = False
                # Whole tensors to the host: a reduction on device would be one more program.
                if run.chosen["finished"].cpu().numpy().all():
                    break
        return run

    def read(self, run: Run) -> dict[str, np.ndarray]:
        state = {name: value.cpu().numpy() for name, value in run.chosen.items()}
        for name in (
            "ids",
            "valid",
        ):  # the columns of the padded request's prompt bucket, as the driver counts
            state[name] = state[name][:, run.grow :]
        return state

    def stop_rows(self, run: Run, rows: np.ndarray) -> Run:
        stopped = torch.from_numpy(rows).to(runtime.device())
        run.chosen = {**run.chosen, "finished": run.chosen["finished"] | stopped}
        torch_xla.sync()
        return run

    def take_tokens(self, run: Run, token: np.ndarray, finished: np.ndarray) -> Run:
        device, chosen = runtime.device(), run.chosen
        ids = chosen["ids"]
        # the bucket's own prompt width (the driver's plus ``grow``); the step traced, one graph for all
        column = run.static.decoding.prompt - 1 + chosen["step"]
        at = torch.arange(ids.shape[1], device=device)[None] == column
        given = torch.from_numpy(token.astype(np.int32)).to(device)[:, None].to(ids.dtype)
        stopped = torch.from_numpy(finished).to(device)
        run.chosen = {**chosen, "ids": torch.where(at, given, ids), "finished": stopped}
        torch_xla.sync()
        return run

    def cache(
        self,
        run: Run,
        rows: int,
        start: int,
        end: int,
        source: int | None = None,
        whole: bool = False,
    ) -> Any:
        """The attention layers' keys and values in slots ``[start, end)`` of the prompt's bucket as a
        transformers ``DynamicCache`` for the model's config (every slot of every layer with ``whole``),
        on the CPU; an encoder-decoder's as an
        ``EncoderDecoderCache`` whose cross-attention part holds the encoder's first ``source`` positions
        (all with ``None``); ``None`` for a layer with other states."""
        from transformers.cache_utils import DynamicCache

        if run.cache is None:
            return None
        plain = all(
            isinstance(layer, StaticLayer)
            and layer.is_initialized
            and not getattr(layer, "is_indexer_initialized", False)
            for layer in _layers(run.cache)
        )
        if not plain:
            return None

        def dynamic(layers: list[Any], window: slice) -> Any:
            cache = DynamicCache(config=self.model.config)
            # A T5 decoder deeper than its encoder has more layers than its config counts (transformers'
            # own generate fails there): a cache that adds them as they come.
            if whole or len(cache.layers) < len(layers):
                cache = DynamicCache()
            for index, layer in enumerate(layers):
                # Whole buffers to the host, cut there: a cut on the device would be a program per shape.
                keys, values = (t.cpu()[:rows, :, window] for t in (layer.keys, layer.values))
                cache.update(keys, values, index)
            return cache

        window = slice(run.grow + start, run.grow + end)
        if run.source is None:
            return dynamic(run.cache.layers, window)
        # Filled before wrapping: the wrapper marks the cross-attention layers it finds filled as read.
        return EncoderDecoderCache(
            dynamic(run.cache.self_attention_cache.layers, window),
            dynamic(run.cache.cross_attention_cache.layers, slice(0, source)),
        )

    def counters(self) -> tuple[int, float]:
        counters = runtime.counters()
        return counters.compiles, counters.compile_seconds + _trace_seconds[0]


def _grown_inputs(padded: driver.PaddedRequest, grow: int) -> dict[str, np.ndarray]:
    """The model inputs of ``padded`` for a prompt bucket ``grow`` columns wider: those laid out like the prompt
    (token types, positions) padded on the left with zeros, as the prompt is."""
    grown = {}
    for name, value in padded.inputs.items():
        aligned = value.shape == padded.ids.shape or name == "position_ids"
        widths = [(0, 0)] * (value.ndim - 1) + [(grow, 0)]
        if name == "inputs_embeds":  # one vector per token: the tokens' axis is the second
            aligned, widths = True, [(0, 0), (grow, 0), (0, 0)]
        grown[name] = np.pad(value, widths) if aligned and grow else value
    return grown


def generate(model: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
    """transformers' ``generate`` on the PyTorch/XLA backend (:func:`hfax.generation.driver.generate`)."""
    return driver.generate(model, TorchXlaEngine(model), input_ids, attention_mask, **options)
