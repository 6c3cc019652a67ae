"""The JAX backend's generation engine: prefill and the whole decode loop as compiled XLA programs.

hfax-core's driver (:mod:`hfax.generation.driver`) settles a request and calls :class:`JaxEngine`: its
prefill program runs the prompt and chooses the first token, its decode program runs a
``jax.lax.while_loop`` up to a limit or until every row finished. The token choice inside both is
hfax-core's torch code (:mod:`hfax.generation.tokens`), traced through torchax. Shapes are bucketed by the
core; the processors' settings, the token limit and the seed are traced values, so a stream of requests
compiles a bounded number of programs. Positions come from the prompt's mask, so a padded prompt produces
the tokens it produces alone; a model that takes no ``position_ids`` keeps its prompt's own length.

On a mesh, prompt rows are split over the batch axes (``data``, ``fsdp``), the KV cache over rows and heads
(``mesh.cache_sharding``), and the token state handed back is whole on every device, so every process of a
multi-host mesh reads the same result.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hfax import masks
from hfax.backends.jax import cache as slot_cache
from hfax.backends.jax import constants as held
from hfax.backends.jax import decode_layout, lowerings, mesh, monitor, pytrees
from hfax.backends.jax.runtime import env, to_array, to_tensor
from hfax.generation import driver, layer_outputs, tokens
from hfax.generation.inputs import encode
from hfax.generation.shapes import accepts, cache_argument
from hfax.generation.traits import Appended, generation_traits


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything about one generate program that fixes its shape or structure (hashable, for ``jax.jit``).

    ``constants`` are the prefill's model inputs read as constants (:class:`~hfax.backends.jax.constants.Constant`); ``blocks`` says the
    prefill's mask lets an image's tokens see each other (from ``token_type_ids``, as Gemma 3's does).
    """

    decoding: tokens.Decoding
    layer_types: tuple[tuple[str, int], ...] | None
    mask_form: masks.MaskForm
    cache_argument: str  # "" for a model without a cache
    pass_positions: bool
    logits_to_keep: bool
    encoder_decoder: bool = False
    constants: tuple[held.Constant, ...] = ()
    blocks: bool = False
    appended: Appended | None = None  # a token after the tokens so far at every step

    @property
    def attends(self) -> bool:
        """Whether any layer attends over past tokens (a purely recurrent model needs no mask to decode)."""
        kinds = {kind for kind, _ in self.layer_types or ()}
        return self.layer_types is None or bool(kinds - slot_cache.LINEAR_TYPES)


@dataclasses.dataclass(frozen=True)
class Window:
    """The tokens one forward reads: ``ids`` at ``positions``, in the cache slots ``queries``, written from
    ``slot`` into a cache of ``valid.shape[1]`` slots of which ``valid`` (``[batch, slots]``, bool) marks the
    real tokens."""

    ids: Any
    positions: Any
    valid: Any
    queries: Any
    slot: Any = 0

    def as_tensors(self) -> Window:
        return Window(*to_tensor((self.ids, self.positions, self.valid, self.queries, self.slot)))


@dataclasses.dataclass(frozen=True)
class Forward:
    """The model's forward as one program runs it: ``params`` held as ``layout`` says
    (:mod:`~hfax.backends.jax.decode_layout`; its transposed weights go to the model as the ``[out, in]`` it
    expects). :meth:`decoder` serves decoder-only models, :meth:`encoder_decoder` the others; both return
    the logits of one position in float32 and the cache's states after the forward; :meth:`decoder` also
    the per-layer outputs the decoding records (:mod:`hfax.generation.layer_outputs`), ``{}`` if none."""

    model: Any
    static: Static
    layout: decode_layout.DecodeLayout
    params: Any

    def decoder(
        self,
        window: Window,
        states: Any,
        *,
        inputs: Any = None,
        masked: bool = True,
        at: Any = None,
        every: bool = False,
        token_types: Any = None,
        kept: Any = None,
    ) -> tuple[Any, Any, dict[str, Any]]:
        """A decoder-only forward over ``window`` into the cache holding ``states`` (``None``: a cache of
        the window's length, new). A prefill passes ``inputs`` (the model's other inputs, images included)
        and ``static.constants`` go with them; a recurrent model decoding needs no mask (not ``masked``). A
        model without a cache reads all of the window's ids and gives the logits at position ``at``; the
        others give the last position's, or with ``every`` every position's (``[batch, window, vocab]``).
        ``token_types`` are the whole prompt's, for its image blocks, where the window is the part after a
        loaded cache (else ``inputs``' own). ``kept`` (bool ``[window]``, or ``[batch, window]``) marks
        the window's columns whose cached keys and values stay as ``states`` hold them
        (:class:`~hfax.backends.jax.cache.SlotCache`)."""
        static = self.static
        constants = inputs is not None and bool(static.constants)
        if constants:
            inputs = {
                **inputs,
                **{constant.name: constant.array() for constant in static.constants},
            }
        with env(), lowerings.row_products(self.layout.row_products), held.folding(constants):
            tparams = self._torch_params()
            twindow = window.as_tensors()
            tstates, tinputs = to_tensor((states, inputs))
            blocks = None
            if static.blocks and tinputs is not None:
                types = tinputs["token_type_ids"] if token_types is None else to_tensor(token_types)
                blocks = masks.block_ids(self.model.module)(types)
            tmask = self._mask(twindow, blocks) if masked else None
            cache = None
            if static.cache_argument:
                cache = slot_cache.SlotCache(
                    window.valid.shape[1],
                    twindow.slot,
                    static.layer_types,
                    tstates,
                    in_place=self.layout.in_place_cache,
                    dtype=slot_cache.buffer_dtype(self.model.dtype, self.model.platform),
                    kept=None if kept is None else to_tensor(kept),
                )
            kwargs = dict(input_ids=twindow.ids, attention_mask=tmask)
            if tinputs is not None and "inputs_embeds" in tinputs:  # the prompt as embeddings
                del kwargs["input_ids"]
            asked = layer_outputs.flags(static.decoding, self.model.module)
            kwargs.update(asked)
            # Multimodal positions among the inputs replace the plain ones.
            output = self._call(tparams, kwargs, cache, twindow.positions, tinputs, every=every)
            logits = output.logits if at is not None or every else output.logits[:, -1, :]
            after = output.logits[..., :1]  # one column suffices (cache.ordered_after)
            new_states = cache.states(after=after) if cache is not None else []
            recorded = {
                name: layer_outputs.stacked(getattr(output, name))
                for name, flag in layer_outputs.ASKED_BY.items()
                if flag in asked
            }
            logits, new_states, recorded = to_array((logits, new_states, recorded))
        if at is not None:
            logits = jax.lax.dynamic_index_in_dim(logits, at, axis=1, keepdims=False)
        return logits.astype(jnp.float32), self._constrained(new_states), recorded

    def encoder_decoder(
        self, window: Window, states: Any, source: dict[str, Any], kept: Any = None
    ) -> tuple[Any, Any, Any, dict[str, Any]]:
        """The decoder's forward over ``window`` against ``source``: the encoder's inputs by name on the
        first step (``states`` is ``None``, or after a caller's cache its self-attention states alone,
        ``{"self": ..., "cross": None}``, whose ``kept`` columns stay as loaded), which runs the encoder
        alone as transformers' ``generate`` does; its output ``{"encoded", "mask"}`` (no ``mask`` for
        features) after. Also returns the encoder's output, which the decode loop carries, and the
        per-layer outputs the decoding records (the encoder's on the first step;
        :mod:`hfax.generation.layer_outputs`)."""
        decoding = self.static.decoding
        flags = layer_outputs.flags(decoding, self.model.module)
        asked = [
            field
            for field in layer_outputs.asked(decoding, encoder_decoder=True)
            if "attentions" not in field or "output_attentions" in flags
        ]
        recorded: dict[str, Any] = {}
        with env(), lowerings.row_products(self.layout.row_products):
            tparams = self._torch_params()
            twindow = window.as_tensors()
            tstates, tsource = to_tensor((states, source))
            tmask = self._mask(twindow, None)
            if "encoded" not in tsource:
                encoder = _Encoder(self.model.module)
                encoded = torch.func.functional_call(
                    encoder,
                    _prefixed(tparams),
                    (),
                    {**tsource, **flags},
                    tie_weights=True,
                    strict=False,
                )
                for name in asked:
                    if name.startswith("encoder_"):
                        recorded[name] = layer_outputs.stacked(getattr(encoded, name[8:]))
                if flags:  # the decode loop carries the last hidden state only
                    encoded = type(encoded)(last_hidden_state=encoded.last_hidden_state)
                mask = tsource.get("attention_mask")
                tsource = (
                    {"encoded": encoded} if mask is None else {"encoded": encoded, "mask": mask}
                )
            cache = _encoder_decoder_cache(
                window.valid.shape[1], twindow.slot, tstates, tsource, to_tensor(kept)
            )
            kwargs = dict(
                decoder_input_ids=twindow.ids,
                decoder_attention_mask=tmask,
                encoder_outputs=tsource["encoded"],
            )
            if "mask" in tsource:
                kwargs["attention_mask"] = tsource["mask"]
            kwargs.update(flags)
            output = self._call(tparams, kwargs, cache, twindow.positions)
            new_states = {
                "self": cache.self_attention_cache.states(),
                "cross": cache.cross_attention_cache.states(),
            }
            for name in asked:
                if not name.startswith("encoder_"):
                    recorded[name] = layer_outputs.stacked(getattr(output, name))
            encoded = tsource["encoded"]
            pytrees.register(type(encoded))  # carried from step to step by the decode loop
            logits, new_states, encoded, recorded = to_array(
                (output.logits[:, -1, :], new_states, encoded, recorded)
            )
        return logits.astype(jnp.float32), self._constrained(new_states), encoded, recorded

    def _torch_params(self) -> dict[str, Any]:
        transposed = self.layout.transposed
        return {
            name: value.T if name in transposed else value
            for name, value in to_tensor(self.params).items()
        }

    def _mask(self, window: Window, blocks: Any) -> Any:
        form, dtype = self.static.mask_form, self.model.module.dtype
        return masks.attention_mask(form, window.valid, window.queries, dtype, blocks)

    def _call(
        self,
        tparams: Any,
        kwargs: dict[str, Any],
        cache: Any,
        positions: Any,
        inputs: Any = None,
        every: bool = False,
    ) -> Any:
        static = self.static
        if cache is not None:
            kwargs.update({static.cache_argument: cache, "use_cache": True})
        elif accepts(self.model.module, "use_cache"):
            # Decoding without a cache: a model that keeps state in itself (RecurrentGemma) must not either.
            kwargs["use_cache"] = False
        if static.pass_positions:
            kwargs["position_ids"] = positions
        if static.appended is not None and static.appended.lang is not None:
            kwargs["langs"] = torch.full_like(kwargs["input_ids"], static.appended.lang)
        kwargs.update(inputs or {})
        if static.logits_to_keep and cache is not None and not every:
            kwargs["logits_to_keep"] = 1
        return torch.func.functional_call(
            self.model.module, tparams, (), kwargs, tie_weights=True, strict=False
        )

    def _constrained(self, states: Any) -> Any:
        """On a mesh: heads over `model`, rows over the batch axes, in prefill and every decode step."""
        if self.model.mesh is None:
            return states
        return mesh.constrain(states, functools.partial(_state_sharding, self.model.mesh))


class _Encoder(torch.nn.Module):
    """An encoder-decoder's encoder as a module of its own, whose weights keep the full model's names."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: Any) -> Any:
        return encode(self.model, inputs)


def _prefixed(params: dict[str, Any]) -> dict[str, Any]:
    return {f"model.{name}": value for name, value in params.items()}


def _encoder_decoder_cache(
    length: int, slot: Any, states: Any, source: dict[str, Any], kept: Any = None
) -> Any:
    """Slot caches for the decoder's self-attention and for its cross-attention over the encoder's output,
    whose keys and values the first step computes and later steps read. After a caller's cache the
    self-attention states come loaded (their ``kept`` columns stay) and the cross-attention is new."""
    from transformers.cache_utils import EncoderDecoderCache

    source_length = source["encoded"][0].shape[1]
    if states is None:
        return EncoderDecoderCache(
            slot_cache.SlotCache(length, slot), slot_cache.SlotCache(source_length, 0)
        )
    decoder = slot_cache.SlotCache(length, slot, states=states["self"], kept=kept)
    if states["cross"] is None:
        return EncoderDecoderCache(decoder, slot_cache.SlotCache(source_length, 0))
    cache = EncoderDecoderCache(
        decoder,
        slot_cache.SlotCache(source_length, 0, states=states["cross"]),
    )
    cache.is_updated = dict.fromkeys(range(len(states["cross"])), True)
    return cache


def _state_sharding(device_mesh: Any, shape: tuple[int, ...]) -> Any:
    """Key and value buffers split over rows and heads; other layer states (conv, recurrent) over rows."""
    return (
        mesh.cache_sharding(device_mesh, shape)
        if len(shape) == 4
        else mesh.batch_sharding(device_mesh, shape)
    )


def _on_torch(fn: Any, *args: Any) -> Any:
    """``fn`` (hfax-core's torch code) run on JAX values through torchax; JAX values back.

    torch indexes with int64 tensors; JAX, without x64, computes them in int32 and warns each time.
    """
    with env(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Explicitly requested dtype int64", UserWarning)
        return to_array(fn(*to_tensor(args)))


def _whole(model: Any, tree: Any) -> Any:
    """``tree`` replicated on every device of the model's mesh (unchanged without a mesh)."""
    if model.mesh is None:
        return tree
    whole = jax.sharding.NamedSharding(model.mesh, jax.sharding.PartitionSpec())
    return mesh.constrain(tree, lambda shape: whole)


def prefill(
    model: Any,
    static: Static,
    params: Any,
    ids: jax.Array,
    prompt_mask: jax.Array,
    arrays: Any,
    source: Any = None,
    inputs: Any = None,
) -> dict[str, Any]:
    """Run the prompt, fill the cache, and choose the first new token.

    For an encoder-decoder, ``ids`` is the decoder's prompt and ``source`` the encoder's inputs by name:
    the encoder runs here, once. A decoder-only model's other ``inputs`` (images, ...) run here too, and
    their ``offsets`` (``[rows]``, multimodal positions) move the positions of the tokens after the prompt.
    """
    inputs = dict(inputs or {})
    offsets = inputs.pop("offsets", None)
    batch, length = ids.shape
    capacity = static.decoding.capacity
    positions = jnp.where(prompt_mask, jnp.cumsum(prompt_mask, axis=1) - 1, 1)
    # The prompt runs against a cache of its own length, as in transformers' first step (recurrent layers
    # take the mask's last `length` entries as the prompt's); the attention buffers then grow by the capacity.
    layout = _layout(model, static, batch, steps=0)
    forward = Forward(model, static, layout, params)
    window = Window(ids, positions, prompt_mask, jnp.arange(length))
    if static.appended is not None:
        # The prompt and the appended token, whose logits choose the first new token.
        read = jnp.concatenate([prompt_mask, jnp.ones((batch, 1), bool)], axis=1)
        appended = jnp.full((batch, 1), static.appended.token, ids.dtype)
        window = Window(
            jnp.concatenate([ids, appended], axis=1),
            jnp.where(read, jnp.cumsum(read, axis=1) - 1, 1),
            read,
            jnp.arange(length + 1),
        )
    if static.encoder_decoder:
        logits, states, hidden, recorded = forward.encoder_decoder(window, None, source)
    else:
        logits, states, recorded = forward.decoder(window, None, inputs=inputs)
        hidden = None
    decoding = static.decoding
    chosen = _on_torch(
        lambda i, m, lg, a: tokens.start(i, m, lg, decoding, a), ids, prompt_mask, logits, arrays
    )
    valid = jnp.concatenate([prompt_mask, jnp.ones((batch, capacity), bool)], axis=1)
    if static.encoder_decoder:
        states = {**states, "self": slot_cache.grow(states["self"], capacity)}
    else:
        states = slot_cache.grow(states, capacity, in_place=layout.in_place_cache)
    if model.mesh is not None:
        states = mesh.constrain(states, functools.partial(_state_sharding, model.mesh))
    state = _decode_state(static, chosen, states, valid, hidden, source, offsets)
    if recorded:
        state["outputs"] = _whole(
            model, _on_torch(lambda r: layer_outputs.start(r, capacity), recorded)
        )
    return state


def _decode_state(
    static: Static,
    chosen: Any,
    states: Any,
    valid: Any,
    hidden: Any,
    source: Any,
    offsets: Any,
) -> dict[str, Any]:
    """What the decode loop carries after the prompt (:func:`prefill`'s and :func:`resume`'s alike, so
    both feed one decode program): the token state, the cache's states and valid slots, an
    encoder-decoder's encoder output and source mask, the rows' position offsets where there are any."""
    state = {"tokens": chosen, "states": states, "valid": valid}
    if static.encoder_decoder:
        state["source"] = {"encoded": hidden}
        if "attention_mask" in source:
            state["source"]["mask"] = source["attention_mask"]
    if offsets is not None:
        state["offsets"] = offsets
    return state


def resume(
    model: Any,
    static: Static,
    fed: int,
    params: Any,
    ids: jax.Array,
    prompt_mask: jax.Array,
    loaded: list[dict[str, jax.Array]],
    start: jax.Array,
    arrays: Any,
    inputs: Any = None,
    source: Any = None,
) -> dict[str, Any]:
    """:func:`prefill` after a caller's cache (:class:`hfax.generation.loaded_cache.Resume`): ``loaded``
    holds every layer's keys and values over the prompt's columns (zeros where it holds none: what precedes
    a sliding layer's window, and hfax's padding), and only the prompt's last ``fed`` columns run through
    the model, at their own positions, against them. The cache keeps the loaded keys and values before
    ``start`` (traced: the first new token's column), so the fed columns before it only fill the window,
    and one program serves every cached length of a prompt bucket and ``fed``. ``inputs`` are laid out
    like ``ids`` (token types) or are the prompt's multimodal positions with each row's ``offsets`` for
    the tokens after it: the tokens fed get theirs, the image blocks come from all of them. The
    state has :func:`prefill`'s structure and placement, so the decode program is the one a call without
    a cache runs. An encoder-decoder's ``loaded`` are its decoder's self-attention layers and ``source``
    the encoder's inputs: the encoder and the cross-attention run here, as in :func:`prefill`."""
    batch, length = ids.shape
    capacity = static.decoding.capacity
    layout = _layout(model, static, batch, steps=0)
    # the buffers' type as prefill makes them (an encoder-decoder's are the keys' own)
    dtype = None if static.encoder_decoder else slot_cache.buffer_dtype(model.dtype, model.platform)
    dtype = model.dtype if dtype is None else getattr(jnp, str(dtype).removeprefix("torch."))

    def slots(value: jax.Array) -> jax.Array:
        return jnp.pad(value, [(0, 0), (0, 0), (0, capacity), (0, 0)]).astype(dtype)

    states = []
    for layer in loaded:
        keys = slots(layer["keys"])
        keys = jnp.swapaxes(keys, 2, 3) if layout.in_place_cache else keys
        states.append({"keys": keys, "values": slots(layer["values"])})
    if model.mesh is not None:
        states = mesh.constrain(states, functools.partial(_state_sharding, model.mesh))
    positions = jnp.where(prompt_mask, jnp.cumsum(prompt_mask, axis=1) - 1, 1)
    valid = jnp.concatenate([prompt_mask, jnp.ones((batch, capacity), bool)], axis=1)
    first = length - fed
    columns = jnp.arange(first, length)
    window = Window(ids[:, first:], positions[:, first:], valid, columns, first)
    inputs = dict(inputs or {})
    offsets = inputs.pop("offsets", None)
    # laid out like the ids, and multimodal positions ([sections, rows, length]): the tokens fed
    fed_inputs = {name: value[..., first:] if name == "position_ids" else value[:, first:]
                  for name, value in inputs.items()}  # fmt: skip
    forward = Forward(model, static, layout, params)
    if static.encoder_decoder:
        logits, states, hidden, _ = forward.encoder_decoder(
            window, {"self": states, "cross": None}, source, kept=columns < start
        )
    else:
        logits, states, _ = forward.decoder(
            window,
            states,
            inputs=fed_inputs,
            token_types=inputs.get("token_type_ids"),
            kept=columns < start,
        )
        hidden = None
    decoding = static.decoding
    chosen = _on_torch(
        lambda i, m, lg, a: tokens.start(i, m, lg, decoding, a), ids, prompt_mask, logits, arrays
    )
    return _decode_state(static, chosen, states, valid, hidden, source, offsets)


def decode(
    model: Any,
    static: Static,
    params: Any,
    state: dict[str, Any],
    limit: jax.Array,
    arrays: Any,
    layout: decode_layout.DecodeLayout,
) -> dict[str, Any]:
    """Choose new tokens up to ``limit`` (or until every row finished), in one while loop that holds the
    weights as ``layout`` says."""
    decoding = static.decoding
    prompt_length = decoding.prompt
    seen = jnp.sum(state["valid"][:, :prompt_length], axis=1)

    def unfinished(state: dict[str, Any]) -> jax.Array:
        return _on_torch(tokens.running, state["tokens"], limit)

    def advance(state: dict[str, Any], params: Any = params) -> dict[str, Any]:
        chosen = state["tokens"]
        step = chosen["step"]
        slot = prompt_length + step - 1
        forward = Forward(model, static, layout, params)
        if static.cache_argument:
            last = _on_torch(lambda c: tokens.last_tokens(c, decoding), chosen)
            positions = (seen + step - 1 + state.get("offsets", 0))[:, None]
            window = Window(last, positions, state["valid"], slot[None], slot)
            if static.encoder_decoder:
                logits, states, _, recorded = forward.encoder_decoder(
                    window, state["states"], state["source"]
                )
            else:
                logits, states, recorded = forward.decoder(
                    window, state["states"], masked=static.attends
                )
            if "outputs" in state:  # the per-layer outputs asked for, as this step made them
                state = {
                    **state,
                    "outputs": _on_torch(layer_outputs.write, state["outputs"], recorded, step),
                }
        else:  # the prompt and the tokens so far, the rest masked; the logits of the last token so far
            length = state["valid"].shape[1]
            ids, last = chosen["ids"], slot
            if static.appended is not None:
                # Or of the token appended after them (the buffer has room: the loop ends a slot before).
                last = slot + 1
                ids = jnp.where(jnp.arange(length) == last, static.appended.token, ids)
            valid = state["valid"] & (jnp.arange(length) <= last)[None]
            positions = jnp.where(valid, jnp.cumsum(valid, axis=1) - 1, 1)
            window = Window(ids, positions, valid, jnp.arange(length))
            logits, states, _ = forward.decoder(window, None, at=last)
        chosen, reorder = _on_torch(
            lambda c, lg, a: tokens.advance(c, lg, decoding, a), chosen, logits, arrays
        )
        if reorder is not None:  # beam search: every row's cache now follows the beam it extends
            states = jax.tree.map(lambda x: jnp.take(x, reorder, axis=0), states)
        return {**state, "states": states, "tokens": chosen}

    params = {
        name: value.T if name in layout.transposed else value for name, value in params.items()
    }
    if layout.carries_weights:
        state, _ = jax.lax.while_loop(
            lambda loop: unfinished(loop[0]),
            lambda loop: (advance(*loop), jax.lax.optimization_barrier(loop[1])),
            (state, params),
        )
    else:
        state = jax.lax.while_loop(unfinished, advance, state)
    # Whole on every device, so every process of a multi-host mesh can read them.
    whole = {name: _whole(model, state[name]) for name in ("tokens", "outputs") if name in state}
    return {**state, **whole}


def prefill_program(
    model: Any,
    params: Any,
    ids: Any,
    prompt_mask: Any,
    source: Any,
    arrays: Any,
    inputs: Any,
    static: Static,
) -> Any:
    return prefill(model, static, params, ids, prompt_mask, arrays, source, inputs)


def resume_program(
    model: Any,
    params: Any,
    ids: Any,
    prompt_mask: Any,
    loaded: Any,
    start: Any,
    arrays: Any,
    inputs: Any,
    source: Any,
    static: tuple[Static, int],
) -> Any:
    settled, fed = static
    return resume(
        model, settled, fed, params, ids, prompt_mask, loaded, start, arrays, inputs, source
    )


def decode_program(
    model: Any, params: Any, state: Any, limit: Any, arrays: Any, static: Static
) -> Any:
    layout = _layout(model, static, state["valid"].shape[0], static.decoding.capacity)
    return decode(model, static, params, state, limit, arrays, layout)


def _layout(model: Any, static: Static, rows: int, steps: int) -> decode_layout.DecodeLayout:
    return decode_layout.choose(
        model,
        layer_types=static.layer_types,
        encoder_decoder=static.encoder_decoder,
        rows=rows,
        steps=steps,
    )


@dataclasses.dataclass
class Run:
    """One ``generate`` call on device: its static structure, traced settings and current state."""

    static: Static
    arrays: Any
    state: Any


class JaxEngine:
    """:class:`hfax.generation.driver.Engine` for a :class:`~hfax.backends.jax.model.JaxModel`."""

    features = frozenset(
        {"beams", "encoder_decoder", "layer_outputs", "cache_output", "cache_input", "host_choice"}
    )

    def __init__(self, model: Any) -> None:
        self.model = model
        self.row_multiple = mesh.batch_multiple(model.mesh)

    def start(self, padded: driver.PaddedRequest) -> Run:
        model = self.model
        static = _static(model, padded)
        layer_outputs.check_recordable(
            static.decoding, bool(static.cache_argument) and static.appended is None
        )
        ids, prompt_mask, source, arrays = self.inputs(padded)
        inputs = self.model_inputs(padded, static)
        if padded.resume is not None:
            return Run(
                static,
                arrays,
                self._resume(padded.resume, static, ids, prompt_mask, arrays, inputs, source),
            )
        program = model.program("prefill", prefill_program)
        state = program(model.params, ids, prompt_mask, source, arrays, inputs, static=static)
        return Run(static, arrays, state)

    def _resume(
        self,
        resume: Any,
        static: Static,
        ids: Any,
        prompt_mask: Any,
        arrays: Any,
        inputs: Any,
        source: Any = None,
    ) -> Any:
        """The prefill after the caller's cache, loaded (:func:`resume`): its own program, one per prompt
        bucket and bucket of new tokens; a call without a cache runs none of it."""
        if not static.cache_argument or static.appended is not None:
            raise NotImplementedError(
                f"{type(self.model.module).__name__} decodes without a cache here, so hfax's generate "
                "cannot continue from a caller's: call it without past_key_values, with the whole sequence"
            )
        if static.layer_types is not None and len(resume.layers) != len(static.layer_types):
            raise NotImplementedError(
                f"hfax's JAX cache has {len(static.layer_types or ())} layers for this model and "
                f"past_key_values {len(resume.layers)}: pass a cache this model made"
            )
        loaded = mesh.shard_batch(
            [{"keys": layer.keys, "values": layer.values} for layer in resume.layers],
            self.model.mesh,
        )
        program = self.model.program("resume", resume_program)
        return program(
            self.model.params,
            ids,
            prompt_mask,
            loaded,
            mesh.replicate(np.int32(resume.start), self.model.mesh),
            arrays,
            inputs,
            source,
            static=(static, resume.fed),
        )

    def inputs(self, padded: driver.PaddedRequest) -> tuple[Any, Any, Any, Any]:
        """The prefill's ``(ids, prompt_mask, source, arrays)`` as device arrays: rows split over the
        mesh's batch axes, settings whole on every device."""
        mesh_ = self.model.mesh
        ids, prompt_mask = mesh.shard_batch((padded.ids, padded.mask), mesh_)
        source = None
        if padded.source is not None:
            source = mesh.shard_batch(_device_dtypes(padded.source), mesh_)
        return ids, prompt_mask, source, mesh.replicate(padded.arrays, mesh_)

    def model_inputs(self, padded: driver.PaddedRequest, static: Static) -> dict[str, Any] | None:
        """A decoder-only prefill's other model inputs as device arrays (``None`` without any): those laid
        out like the prompt split as its rows, the rest (images, positions) whole on every device; the
        :class:`~hfax.backends.jax.constants.Constant` ones stay out (the program holds them)."""
        if not padded.inputs and padded.offsets is None:
            return None
        constant = {c.name for c in static.constants}
        traced = _device_dtypes(
            {name: value for name, value in padded.inputs.items() if name not in constant}
        )
        if "inputs_embeds" in traced:  # the host holds float32 (numpy has no bfloat16)
            traced["inputs_embeds"] = jnp.asarray(traced["inputs_embeds"], self.model.dtype)
        rows = {name for name, value in traced.items() if value.shape == padded.ids.shape}
        mesh_ = self.model.mesh
        placed = mesh.shard_batch({name: traced[name] for name in rows}, mesh_)
        placed.update(mesh.replicate({n: v for n, v in traced.items() if n not in rows}, mesh_))
        if padded.offsets is not None:
            placed["offsets"] = mesh.shard_batch(padded.offsets.astype(np.int32), mesh_)
        return placed

    def advance(self, run: Run, limit: int) -> Run:
        limit_array = mesh.replicate(np.int32(limit), self.model.mesh)
        program = self.model.program("decode", decode_program, donate=("state",))
        run.state = program(
            self.model.params, run.state, limit_array, run.arrays, static=run.static
        )
        return run

    def read(self, run: Run) -> dict[str, np.ndarray]:
        """The token state, and the per-layer outputs recorded so far when the call asked for them."""
        chosen = {**run.state["tokens"], **run.state.get("outputs", {})}
        _wait(chosen)
        return {name: np.asarray(value) for name, value in chosen.items() if value is not None}

    def stop_rows(self, run: Run, rows: np.ndarray) -> Run:
        chosen = run.state["tokens"]
        finished = chosen["finished"] | mesh.replicate(rows, self.model.mesh)
        run.state = {**run.state, "tokens": {**chosen, "finished": finished}}
        return run

    def take_tokens(self, run: Run, token: np.ndarray, finished: np.ndarray) -> Run:
        chosen, mesh_ = run.state["tokens"], self.model.mesh
        # The column as a traced value: one program for every step (an index would make one per column).
        column = mesh.replicate(np.int32(run.static.decoding.prompt - 1), mesh_) + chosen["step"]
        at = jnp.arange(chosen["ids"].shape[1], dtype=jnp.int32)[None] == column
        ids = jnp.where(at, mesh.replicate(token.astype(np.int32), mesh_)[:, None], chosen["ids"])
        # placed as the decode program's state was, which a new placement would compile again
        ids = jax.device_put(ids, chosen["ids"].sharding)
        finished = jax.device_put(finished, chosen["finished"].sharding)
        run.state = {**run.state, "tokens": {**chosen, "ids": ids, "finished": finished}}
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
        """The attention layers' keys and values in slots ``[start, end)`` as a transformers
        ``DynamicCache`` for the model's config (its sliding layers keep what transformers' keep; every
        slot with ``whole``), on the
        CPU in the weights' dtype; an encoder-decoder's as an ``EncoderDecoderCache`` whose cross-attention
        part holds the encoder's first ``source`` positions (all with ``None``); ``None`` for a layer with
        other states."""
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        static, states = run.static, run.state["states"]
        groups = [states["self"], states["cross"]] if static.encoder_decoder else [states]
        if any(set(layer) != {"keys", "values"} for group in groups for layer in group):
            return None
        in_place = _layout(
            self.model, static, run.state["valid"].shape[0], static.decoding.capacity
        ).in_place_cache
        dtype = getattr(torch, jnp.dtype(self.model.dtype).name)

        def host(value: Any, window: slice, transposed: bool = False) -> torch.Tensor:
            # The whole buffer to the host, cut there: eager cuts on the device compile one per shape.
            value = np.asarray(value)
            value = np.swapaxes(value, 2, 3) if transposed else value
            return torch.from_numpy(value[:rows, :, window].astype(np.float32)).to(dtype)

        def dynamic(layers: list[dict[str, Any]], window: slice) -> Any:
            cache = DynamicCache(config=self.model.config)
            # A T5 decoder deeper than its encoder has more layers than its config counts (transformers'
            # own generate fails there): a cache that adds them as they come.
            if whole or len(cache.layers) < len(layers):
                cache = DynamicCache()
            for index, layer in enumerate(layers):
                keys = host(layer["keys"], window, in_place)
                cache.update(keys, host(layer["values"], window), index)
            return cache

        if not static.encoder_decoder:
            return dynamic(states, slice(start, end))
        # Filled before wrapping: the wrapper marks the cross-attention layers it finds filled as read.
        return EncoderDecoderCache(
            dynamic(states["self"], slice(start, end)),
            dynamic(states["cross"], slice(0, source)),
        )

    def counters(self) -> tuple[int, float]:
        snapshot = monitor.snapshot()
        return snapshot.compiles, snapshot.compile_seconds + snapshot.trace_seconds


def _wait(tree: Any) -> None:
    """Wait for the device in short sleeps, so that Ctrl-C reaches Python within a fraction of a second
    (a blocking read would hold it until the whole decode loop ended)."""
    leaves = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]
    pause = 0.0002  # short at first: a short program's result is read without a whole pause's delay
    while not all(leaf.is_ready() for leaf in leaves):
        time.sleep(pause)
        pause = min(pause * 2, 0.005)


def _device_dtypes(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """64-bit integers as 32-bit ones, on the host (JAX computes in 32 bits)."""
    return {
        name: value.astype(np.int32) if value.dtype == np.int64 else value
        for name, value in arrays.items()
    }


def _constants(padded: driver.PaddedRequest) -> tuple[held.Constant, ...]:
    """The prefill inputs whose values fix shapes (:mod:`hfax.backends.jax.constants`)."""
    return tuple(
        held.Constant(name, value)
        for name, value in sorted(padded.inputs.items())
        if held.is_size(name, value, padded.ids.shape)
    )


def _static(model: Any, padded: driver.PaddedRequest) -> Static:
    encoder_decoder = padded.source is not None
    blocks = "token_type_ids" in padded.inputs and masks.block_ids(model.module) is not None
    length = padded.decoding.prompt + padded.decoding.capacity
    return Static(
        decoding=padded.decoding,
        layer_types=None if encoder_decoder else slot_cache.layer_types(model.config),
        mask_form=masks.form(model.config, model.module),
        cache_argument=cache_argument(model.module, length),
        pass_positions=padded.positions,
        logits_to_keep=accepts(model.module, "logits_to_keep"),
        encoder_decoder=encoder_decoder,
        constants=_constants(padded),
        blocks=blocks,
        appended=None if encoder_decoder else generation_traits(model.module).appended,
    )


def generate(model: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
    """transformers' ``generate`` on the JAX backend (:func:`hfax.generation.driver.generate`)."""
    return driver.generate(model, JaxEngine(model), input_ids, attention_mask, **options)


def start(model: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Run:
    """What ``generate`` starts for these arguments: the request settled, bucketed and prefilled."""
    from hfax.generation import settings

    engine = JaxEngine(model)
    request = settings.prepare(model, input_ids, attention_mask, options, engine.features)
    return engine.start(driver.pad_request(model, request, engine))


def lower(
    model: Any, input_ids: Any, attention_mask: Any = None, **options: Any
) -> jax.stages.Lowered:
    """The decode program ``generate`` runs for these arguments, lowered but not run (its prefill runs).

    ``lower(model, ids, max_new_tokens=8).compile().as_text()`` is the optimized HLO, e.g. to count the
    collectives a mesh costs.
    """
    run = start(model, input_ids, attention_mask, **options)
    limit = mesh.replicate(np.int32(run.static.decoding.capacity), model.mesh)
    program = model.program("decode", decode_program, donate=("state",))
    return program.lower(model.params, run.state, limit, run.arrays, static=run.static)
