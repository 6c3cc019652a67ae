"""``generate`` with transformers' semantics, compiled whole: prefill plus the decode loop in one XLA program.

Shapes are bucketed (batch to powers of two, prompt and new-token counts to powers of two from 16) so a
stream of different requests compiles a bounded number of programs; the token count itself, the sampling
settings and the seed are traced values. Prompts are left-padded into their bucket; padding slots are
masked, and positions come from the mask, so a padded prompt produces the tokens it produces alone. A
model that takes no ``position_ids`` counts positions from the cache length, which bucket padding would
shift: its prompts keep their own length. Sampling and EOS handling run on device; the host sees the
result once, or once per chunk when a streamer is given.

On a mesh, prompt rows are split over the batch axes (``data``, ``fsdp``), the KV cache over rows and heads
(``mesh.cache_sharding``), and the tokens handed back are whole on every device, so every process of a
multi-host mesh reads the same result.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hfax import masks
from hfax.backends.jax import cache as slot_cache
from hfax.backends.jax import lowerings, mesh, monitor, pytrees
from hfax.backends.jax.runtime import env, to_array, to_tensor
from hfax.generation import (
    MIN_LENGTH_BUCKET,
    STREAM_CHUNK,
    GenerateStats,
    accepts,
    bucket,
    check_streamer,
    decoder_start,
    is_encoder_decoder,
    pad_prompts,
    resolve,
)

#: The settings of ``hfax.generation.OPTIONAL`` this backend implements.
OPTIONAL = (
    "forced_eos_token_id",
    "forced_bos_token_id",
    "decoder_start_token_id",
    "begin_suppress_tokens",
)


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything about one generate program that fixes its shape or structure (hashable, for ``jax.jit``)."""

    capacity: int
    do_sample: bool
    layer_types: tuple[tuple[str, int], ...] | None
    mask_plan: masks.MaskPlan
    cache_argument: str  # "" for a model without a cache
    pass_positions: bool
    logits_to_keep: bool
    encoder_decoder: bool = False

    @property
    def attends(self) -> bool:
        """Whether any layer attends over past tokens (a purely recurrent model needs no mask to decode)."""
        kinds = {kind for kind, _ in self.layer_types or ()}
        return self.layer_types is None or bool(kinds - slot_cache.LINEAR_TYPES)


def _step(
    model: Any,
    static: Static,
    params: Any,
    states: Any,
    ids: Any,
    positions: Any,
    valid: Any,
    query_slots: Any,
    slot: Any,
    source: Any = None,
    at: Any = None,
    masked: bool = True,
    transposed: frozenset[str] = frozenset(),
) -> Any:
    """One forward over ``ids`` at ``query_slots``, written from ``slot`` into a cache of ``valid.shape[1]`` slots.

    ``valid`` (``[batch, slots]``, bool) says which slots hold real tokens; the attention mask comes from it
    through ``hfax.masks``, unless not ``masked`` (a recurrent model decoding needs none). An
    encoder-decoder decodes ``ids`` against ``source``: the encoder's input ``{"ids", "mask"}`` on the first
    step, which runs the encoder, its output ``{"encoded", "mask"}`` after. A model without a cache reads
    all of ``ids`` and gives the logits at position ``at``. The ``transposed`` weights of ``params`` are held
    ``[in, out]`` (see :func:`_transposed_weights`) and given to the model as the ``[out, in]`` it expects.
    Returns the last (or ``at``) position's logits, the cache states and the encoder's output (``None``
    without an encoder).
    """
    length = valid.shape[1]
    tparams, tids, tpositions, tvalid, tqueries, tslot, tstates, tsource = to_tensor(
        (params, ids, positions, valid, query_slots, slot, states, source)
    )
    with env(), lowerings.row_products(_loop_reads_16_bits(model)):
        tparams = {
            name: value.T if name in transposed else value for name, value in tparams.items()
        }
        tmask = (
            masks.attention_mask(static.mask_plan, tvalid, tqueries, model.module.dtype)
            if masked
            else None
        )
        if static.encoder_decoder:
            if (
                "encoded" not in tsource
            ):  # the first step: the encoder runs alone, as in transformers' generate
                encoder = _Encoder(model.module)
                encoded = torch.func.functional_call(
                    encoder,
                    _prefixed(tparams),
                    (tsource["ids"], tsource["mask"]),
                    tie_weights=True,
                    strict=False,
                )
                tsource = {"encoded": encoded, "mask": tsource["mask"]}
            cache = _encoder_decoder_cache(length, tslot, tstates, tsource)
            kwargs: dict[str, Any] = dict(
                decoder_input_ids=tids, decoder_attention_mask=tmask, attention_mask=tsource["mask"]
            )
            kwargs["encoder_outputs"] = tsource["encoded"]
        else:
            cache = None
            if static.cache_argument:
                dtype = slot_cache.buffer_dtype(model.dtype, model.platform)
                cache = slot_cache.SlotCache(
                    length,
                    tslot,
                    static.layer_types,
                    tstates,
                    in_place=_in_place(model, static),
                    dtype=dtype,
                )
            kwargs = dict(input_ids=tids, attention_mask=tmask)
        if cache is not None:
            kwargs.update({static.cache_argument: cache, "use_cache": True})
        if static.pass_positions:
            kwargs["position_ids"] = tpositions
        if static.logits_to_keep and cache is not None:
            kwargs["logits_to_keep"] = 1
        output = torch.func.functional_call(
            model.module, tparams, (), kwargs, tie_weights=True, strict=False
        )
        logits = output.logits if at is not None else output.logits[:, -1, :]
        if static.encoder_decoder:
            new_states = {
                "self": cache.self_attention_cache.states(),
                "cross": cache.cross_attention_cache.states(),
            }
            hidden = tsource["encoded"]
            pytrees.register(type(hidden))  # carried from step to step by the decode loop
        else:
            new_states, hidden = (
                (cache.states(after=output.logits) if cache is not None else []),
                None,
            )
        logits, new_states, hidden = to_array((logits, new_states, hidden))
    if at is not None:
        logits = jax.lax.dynamic_index_in_dim(logits, at, axis=1, keepdims=False)
    if (
        model.mesh is not None
    ):  # heads over `model`, rows over the batch axes, in prefill and every decode step
        new_states = mesh.constrain(new_states, functools.partial(_state_sharding, model.mesh))
    return logits.astype(jnp.float32), new_states, hidden


def _loop_reads_16_bits(model: Any) -> bool:
    """Whether the decode loop carries the weights and multiplies 16-bit rows as they are (on one CPU device).

    XLA:CPU multiplies 16-bit weights by converting them to float32, and hoists a conversion of loop-invariant
    weights out of the loop: each step then reads float32. Carried through the loop (past an optimization
    barrier) the weights are no longer invariant, and with :func:`lowerings.row_products` each step reads
    them in 16 bits (see there for the numbers; resident memory also drops by the float32 copy).
    """
    dtype = model.dtype
    return (
        model.platform == "cpu"
        and model.mesh is None
        and jnp.issubdtype(dtype, jnp.floating)
        and jnp.finfo(dtype).bits == 16
    )


#: The fewest decode steps a loop must be able to run for :func:`_transposed_weights` to transpose the weights
#: (the copy costs about 30 steps' savings on the benchmark Llama).
TRANSPOSE_FROM_STEPS = 64


def _transposed_weights(model: Any, static: Static, rows: int) -> frozenset[str]:
    """The weights a decode loop of ``static.capacity`` steps over ``rows`` rows reads transposed, ``[in, out]``.

    On one CPU device, XLA:CPU multiplies a few rows by an ``[in, out]`` matrix faster than by PyTorch's
    ``[out, in]``. On the benchmark Llama with 128 new tokens, tok/s with the copy against without (A/B runs
    of ``benchmarks/decode.py``; docs/PERFORMANCE.md has a whole run with it): float32 at batch 2, 4 and 8:
    55-61 / 51, 118-121 / 88-91, 189 / 159 (prompt 32; 159 / 126 at prompt 512); bfloat16 at batch 2: 88-94
    / 100-108, batch 4: even, batch 8: 272 / 244. ``decode`` transposes a copy of every ``nn.Linear`` weight
    before its loop, which holds memory for the copy while it runs and costs about 30 steps' savings in
    time: so for float32 from two rows, for 16-bit weights from eight, and only for loops of
    :data:`TRANSPOSE_FROM_STEPS` steps or more. One row (a matrix-vector product) reads the ``[out, in]``
    matrix as fast or faster; other platforms and meshes choose their own layouts. A weight tied to another
    (an embedding that is also the output layer) stays as it is, as its other use wants its own layout.
    """
    if model.platform != "cpu" or model.mesh is not None or static.capacity < TRANSPOSE_FROM_STEPS:
        return frozenset()
    if rows < (8 if _loop_reads_16_bits(model) else 2):
        return frozenset()
    uses = collections.Counter(
        id(tensor) for _, tensor in model.module.named_parameters(remove_duplicate=False)
    )
    return frozenset(
        f"{prefix}.weight"
        for prefix, module in model.module.named_modules()
        if isinstance(module, torch.nn.Linear)
        and f"{prefix}.weight" in model.params
        and uses[id(module.weight)] == 1
    )


def _in_place(model: Any, static: Static) -> bool:
    """Whether the slot cache updates in place (``cache.SlotCache``): a decoder-only model whose layers are all
    attention, on one device."""
    kinds = {kind for kind, _ in static.layer_types or ()}
    return (
        model.mesh is None
        and not static.encoder_decoder
        and kinds <= set(slot_cache.ATTENTION_TYPES)
    )


class _Encoder(torch.nn.Module):
    """An encoder-decoder's encoder as a module of its own, whose weights keep the full model's names."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Any, mask: Any) -> Any:
        return self.model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)


def _prefixed(params: dict[str, Any]) -> dict[str, Any]:
    return {f"model.{name}": value for name, value in params.items()}


def _encoder_decoder_cache(length: int, slot: Any, states: Any, source: dict[str, Any]) -> Any:
    """Slot caches for the decoder's self-attention and for its cross-attention over the encoder's output,
    whose keys and values the first step computes and later steps read."""
    from transformers.cache_utils import EncoderDecoderCache

    source_length = source["mask"].shape[1]
    if states is None:
        return EncoderDecoderCache(
            slot_cache.SlotCache(length, slot), slot_cache.SlotCache(source_length, 0)
        )
    cache = EncoderDecoderCache(
        slot_cache.SlotCache(length, slot, states=states["self"]),
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


def _choose(
    static: Static,
    logits: jax.Array,
    index: jax.Array,
    finished: jax.Array,
    options: dict[str, Any],
) -> tuple[Any, Any]:
    """Pick new token ``index`` of every row, in transformers' order: min-length, suppressed first tokens, forced
    BOS and EOS, then temperature, top-k, top-p."""
    vocab = logits.shape[-1]
    is_eos = jnp.isin(jnp.arange(vocab), options["eos"])
    logits = jnp.where((index < options["min_new_tokens"]) & is_eos[None], -jnp.inf, logits)
    suppressed = (index == 0) & jnp.isin(jnp.arange(vocab), options["begin_suppress"])
    logits = jnp.where(suppressed[None], -jnp.inf, logits)
    # forced_bos_token_id (encoder-decoders): the token after the decoder's start token.
    forced = (index == 0) & (options["forced_bos"] >= 0)
    logits = jnp.where(
        forced, jnp.where(jnp.arange(vocab) == options["forced_bos"], 0.0, -jnp.inf)[None], logits
    )
    # forced_eos_token_id: the last token transformers lets a sequence have is EOS.
    forced = (index == options["max_new"] - 1) & (options["forced_eos"] >= 0)
    logits = jnp.where(
        forced, jnp.where(jnp.arange(vocab) == options["forced_eos"], 0.0, -jnp.inf)[None], logits
    )
    if static.do_sample:
        logits = logits / options["temperature"]
        ascending = jnp.sort(logits, axis=-1)
        k = jnp.clip(options["top_k"], 1, vocab)
        kth = jnp.take_along_axis(
            ascending, jnp.broadcast_to(vocab - k, (logits.shape[0], 1)), axis=-1
        )
        logits = jnp.where((options["top_k"] > 0) & (logits < kth), -jnp.inf, logits)
        # top-p over what top-k left: drop the low-probability tail holding at most 1 - top_p of the mass.
        order = jnp.argsort(logits, axis=-1)
        cumulative = jnp.cumsum(
            jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1), axis=-1
        )
        drop_sorted = (cumulative <= 1 - options["top_p"]).at[:, -1].set(False)
        drop = (
            jnp.zeros_like(drop_sorted)
            .at[jnp.arange(logits.shape[0])[:, None], order]
            .set(drop_sorted)
        )
        logits = jnp.where(drop, -jnp.inf, logits)
        token = jax.random.categorical(
            jax.random.fold_in(jax.random.wrap_key_data(options["key"]), index), logits, axis=-1
        )
    else:
        token = jnp.argmax(logits, axis=-1)
    token = jnp.where(finished, options["pad"], token.astype(jnp.int32))
    return token, finished | jnp.isin(token, options["eos"])


def prefill(
    model: Any,
    static: Static,
    params: Any,
    ids: jax.Array,
    prompt_mask: jax.Array,
    options: dict[str, Any],
    source: Any = None,
) -> dict[str, Any]:
    """Run the prompt, fill the cache, and choose the first new token.

    For an encoder-decoder, ``ids`` is the decoder's start token and ``source`` the encoder's ``{"ids",
    "mask"}``: the encoder runs here, once.
    """
    batch, length = ids.shape
    positions = jnp.where(prompt_mask, jnp.cumsum(prompt_mask, axis=1) - 1, 1)
    # The prompt runs against a cache of its own length, as in transformers' first step (recurrent layers
    # take the mask's last `length` entries as the prompt's); the attention buffers then grow by the capacity.
    logits, states, hidden = _step(
        model, static, params, None, ids, positions, prompt_mask, jnp.arange(length), 0, source
    )
    token, finished = _choose(static, logits, jnp.int32(0), jnp.zeros((batch,), bool), options)
    tokens = jnp.full((batch, static.capacity), options["pad"], jnp.int32).at[:, 0].set(token)
    valid = jnp.concatenate([prompt_mask, jnp.ones((batch, static.capacity), bool)], axis=1)
    if static.encoder_decoder:
        states = {**states, "self": slot_cache.grow(states["self"], static.capacity)}
    else:
        states = slot_cache.grow(states, static.capacity, in_place=_in_place(model, static))
    if model.mesh is not None:
        states = mesh.constrain(states, functools.partial(_state_sharding, model.mesh))
    state = {
        "states": states,
        "tokens": tokens,
        "step": jnp.int32(1),
        "finished": finished,
        "valid": valid,
    }
    if not static.cache_argument:
        state["prompt"] = ids  # a model without a cache reads the whole sequence at every step
    if static.encoder_decoder:
        state["source"] = {"encoded": hidden, "mask": source["mask"]}
    return state


def decode(
    model: Any,
    static: Static,
    params: Any,
    state: dict[str, Any],
    limit: jax.Array,
    options: dict[str, Any],
    transposed: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Choose new tokens ``state["step"]`` up to ``limit`` (or until every row finished), in one while loop
    that reads the ``transposed`` weights (:func:`_transposed_weights`) from a transposed copy."""
    prompt_length = state["valid"].shape[1] - static.capacity
    seen = jnp.sum(state["valid"][:, :prompt_length], axis=1)

    def unfinished(state: dict[str, Any]) -> jax.Array:
        return (state["step"] < limit) & ~jnp.all(state["finished"])

    def advance(state: dict[str, Any], params: Any = params) -> dict[str, Any]:
        step = state["step"]
        last = jax.lax.dynamic_slice_in_dim(state["tokens"], step - 1, 1, axis=1)
        slot = prompt_length + step - 1
        positions = (seen + step - 1)[:, None]
        length = state["valid"].shape[1]
        if static.cache_argument:
            logits, states, _ = _step(
                model,
                static,
                params,
                state["states"],
                last,
                positions,
                state["valid"],
                slot[None],
                slot,
                state.get("source"),
                masked=static.attends,
                transposed=transposed,
            )
        else:  # the prompt and the tokens so far, the rest masked; the logits of the last token so far
            sequence = jnp.concatenate([state["prompt"], state["tokens"]], axis=1)
            valid = state["valid"] & (jnp.arange(length) <= slot)[None]
            positions = jnp.where(valid, jnp.cumsum(valid, axis=1) - 1, 1)
            logits, states, _ = _step(
                model,
                static,
                params,
                [],
                sequence,
                positions,
                valid,
                jnp.arange(length),
                0,
                at=slot,
                transposed=transposed,
            )
        token, finished = _choose(static, logits, step, state["finished"], options)
        tokens = jax.lax.dynamic_update_slice_in_dim(state["tokens"], token[:, None], step, axis=1)
        return {**state, "states": states, "tokens": tokens, "step": step + 1, "finished": finished}

    if transposed:
        params = {name: value.T if name in transposed else value for name, value in params.items()}
    # Weights that travel with the state (past a barrier) are not loop invariants: no conversion of them leaves
    # the loop, and a transposed copy is not transposed back.
    if transposed or _loop_reads_16_bits(model):
        state, _ = jax.lax.while_loop(
            lambda loop: unfinished(loop[0]),
            lambda loop: (advance(*loop), jax.lax.optimization_barrier(loop[1])),
            (state, params),
        )
    else:
        state = jax.lax.while_loop(unfinished, advance, state)
    if (
        model.mesh is not None
    ):  # whole on every device, so every process of a multi-host mesh can read them
        whole = jax.sharding.NamedSharding(model.mesh, jax.sharding.PartitionSpec())
        state = {
            **state,
            **mesh.constrain(
                {key: state[key] for key in ("tokens", "finished")}, lambda shape: whole
            ),
        }
    return state


def _generate_all(
    model: Any,
    params: Any,
    ids: Any,
    prompt_mask: Any,
    source: Any,
    limit: Any,
    options: Any,
    static: Static,
) -> Any:
    state = prefill(model, static, params, ids, prompt_mask, options, source)
    state = decode(
        model,
        static,
        params,
        state,
        limit,
        options,
        _transposed_weights(model, static, ids.shape[0]),
    )
    return state["tokens"], state["step"]


def generate(
    model: Any,
    input_ids: Any,
    attention_mask: Any = None,
    *,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    min_new_tokens: int | None = None,
    forced_eos_token_id: int | None = None,
    begin_suppress_tokens: list[int] | None = None,
    seed: int | None = None,
    streamer: Any = None,
) -> jax.Array:
    """Continue ``input_ids`` (``[batch, length]``, left-padded when lengths differ) on device.

    Returns the prompt followed by ``max_new_tokens`` new tokens, ``[batch, length + max_new_tokens]``; a
    row that produced EOS continues with ``pad_token_id``. For an encoder-decoder (T5, BART, ...)
    ``input_ids`` go to the encoder and the result is the decoder's start token followed by the new
    tokens, ``[batch, 1 + max_new_tokens]``, as transformers returns it. Unset arguments come from the model's
    ``generation_config``, as in transformers; ``forced_eos_token_id`` makes the last new token EOS and
    ``begin_suppress_tokens`` are never the first. Settings of the generation config that hfax does not
    implement (repetition penalties, n-gram blocking, beams) are warned about. Greedy unless ``do_sample``; sampling is reproducible for a
    given ``seed``. A ``streamer`` (``put``/``end``, e.g. ``transformers.TextStreamer``) receives tokens in
    chunks of ``STREAM_CHUNK`` as they are decoded.
    """
    settings = dict(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        min_new_tokens=min_new_tokens,
        seed=seed,
        forced_eos_token_id=forced_eos_token_id,
        begin_suppress_tokens=begin_suppress_tokens,
    )
    ids, mask, s = resolve(model, input_ids, attention_mask, settings, OPTIONAL)
    check_streamer(streamer)
    batch = ids.shape[0]
    max_new = int(s["max_new_tokens"])
    started, before = time.perf_counter(), monitor.snapshot()
    head = _head(model, ids, s)
    if max_new == 0:
        if streamer is not None:
            streamer.put(head)
            streamer.end()
        return jax.device_put(head.astype(np.int32))

    args, static = _arguments(model, ids, mask, s)
    if streamer is None:
        tokens, steps = model.program("generate", _generate_all)(*args, static=static)
        tokens = np.asarray(tokens)
    else:
        tokens, steps = _stream(model, static, args, max_new, streamer, head)
    after = monitor.snapshot()
    model.last_generate_stats = GenerateStats(
        new_tokens=int(steps) * batch,
        seconds=time.perf_counter() - started,
        compile_seconds=(after.compile_seconds - before.compile_seconds)
        + (after.trace_seconds - before.trace_seconds),
        compiles=after.compiles - before.compiles,
    )
    return jax.device_put(np.concatenate([head, tokens[:batch, :max_new]], axis=1).astype(np.int32))


def _arguments(
    model: Any, ids: np.ndarray, mask: np.ndarray, s: dict[str, Any]
) -> tuple[tuple[Any, ...], Static]:
    """The generate program's arguments ``(params, ids, prompt_mask, source, limit, options)`` and its ``Static``.

    Prompts are left-padded into their bucket, with rows enough for every batch axis of the mesh, and split
    over those axes; the settings are replicated. An encoder-decoder's prompt is the decoder's start token
    and ``source`` the encoder's input, padded on the right into its bucket (its positions count from its
    first token); ``source`` is ``None`` for decoder-only models.
    """
    length = ids.shape[1]
    rows = mesh.batch_multiple(model.mesh)
    encoder_decoder = is_encoder_decoder(model)
    positioned = accepts(model.module, "position_ids") and not encoder_decoder
    if encoder_decoder:
        source_ids, source_mask = pad_prompts(ids, mask, s["pad_token_id"], rows, left=False)
        source = mesh.shard_batch(
            {"ids": source_ids, "mask": source_mask.astype(np.int32)}, model.mesh
        )
        start = decoder_start(model, ids, s)
        padded_ids, padded_mask = pad_prompts(
            start, np.ones_like(start, bool), s["pad_token_id"], rows, length=1
        )
    else:
        padded_ids, padded_mask = pad_prompts(
            ids, mask, s["pad_token_id"], rows, length=None if positioned else length
        )
        source = None
    static = Static(
        capacity=bucket(int(s["max_new_tokens"]), MIN_LENGTH_BUCKET),
        do_sample=bool(s["do_sample"]),
        layer_types=None if encoder_decoder else slot_cache.layer_types(model.config),
        mask_plan=masks.plan(model.config, model.module),
        cache_argument=_cache_argument(model),
        pass_positions=positioned,
        logits_to_keep=accepts(model.module, "logits_to_keep"),
        encoder_decoder=encoder_decoder,
    )
    options = {
        "temperature": np.float32(s["temperature"]),
        "top_k": np.int32(s["top_k"]),
        "top_p": np.float32(s["top_p"]),
        "min_new_tokens": np.int32(s["min_new_tokens"]),
        "eos": np.asarray(s["eos_token_id"] or [-1], np.int32),
        "pad": np.int32(s["pad_token_id"]),
        "max_new": np.int32(s["max_new_tokens"]),
        "forced_eos": np.int32(s["forced_eos_token_id"]),
        "forced_bos": np.int32(s["forced_bos_token_id"] if encoder_decoder else -1),
        "begin_suppress": np.asarray(list(s["begin_suppress_tokens"]) or [-1], np.int32),
        "key": np.asarray(jax.random.key_data(jax.random.key(int(s["seed"])))),
    }
    limit, options = mesh.replicate((np.int32(s["max_new_tokens"]), options), model.mesh)
    return (
        model.params,
        *mesh.shard_batch((padded_ids, padded_mask), model.mesh),
        source,
        limit,
        options,
    ), static


def _head(model: Any, ids: np.ndarray, s: dict[str, Any]) -> np.ndarray:
    """What the result starts with: the prompt, or for an encoder-decoder the decoder's start token."""
    return decoder_start(model, ids, s) if is_encoder_decoder(model) else ids


#: Forward arguments of caches hfax's slot cache cannot stand in for (RWKV's state, XLNet's mems, ...).
OTHER_CACHES = ("state", "mems", "use_mems", "cache", "past_buckets_states", "use_cache")


def _cache_argument(model: Any) -> str:
    """The name under which the model's forward takes its cache (Mamba-style models call it ``cache_params``);
    ``""`` for a model without one, which then reads the whole sequence at every step, as transformers does.
    A model with a cache of another kind is refused: re-reading the sequence would not give its tokens."""
    name = next(
        (name for name in ("past_key_values", "cache_params") if accepts(model.module, name)), ""
    )
    other = [argument for argument in OTHER_CACHES if accepts(model.module, argument)]
    if not name and other:
        raise NotImplementedError(
            f"{type(model.module).__name__} keeps a cache hfax's generate cannot drive (its forward takes {other[0]!r}, "
            "not past_key_values or cache_params); run its forward with hfax, or transformers' own generate on CPU"
        )
    return name


def lower(
    model: Any, input_ids: Any, attention_mask: Any = None, **settings: Any
) -> jax.stages.Lowered:
    """The program ``generate`` runs for these arguments, lowered but not run.

    ``lower(model, ids, max_new_tokens=8).compile().as_text()`` is the optimized HLO, e.g. to count the
    collectives a mesh costs.
    """
    ids, mask, s = resolve(model, input_ids, attention_mask, settings, OPTIONAL)
    args, static = _arguments(model, ids, mask, s)
    return model.program("generate", _generate_all).lower(*args, static=static)


def _stream(
    model: Any, static: Static, args: tuple[Any, ...], max_new: int, streamer: Any, ids: np.ndarray
) -> tuple[np.ndarray, int]:
    params, prompt_ids, prompt_mask, source, _, options = args
    streamer.put(ids)
    state = model.program("prefill", prefill_program)(
        params, prompt_ids, prompt_mask, source, options, static=static
    )
    sent = 0
    while True:
        limit = min(sent + STREAM_CHUNK, max_new)
        limit_array = mesh.replicate(np.int32(limit), model.mesh)
        state = model.program("decode", decode_program, donate=("state",))(
            params, state, limit_array, options, static=static
        )
        step = int(state["step"])
        tokens = np.asarray(state["tokens"])
        streamer.put(tokens[: ids.shape[0], sent:step])
        sent = step
        if step >= max_new or bool(np.all(np.asarray(state["finished"]))):
            break
    streamer.end()
    return tokens, sent


def prefill_program(
    model: Any, params: Any, ids: Any, prompt_mask: Any, source: Any, options: Any, static: Static
) -> Any:
    return prefill(model, static, params, ids, prompt_mask, options, source)


def decode_program(
    model: Any, params: Any, state: Any, limit: Any, options: Any, static: Static
) -> Any:
    return decode(model, static, params, state, limit, options)
