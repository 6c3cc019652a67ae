"""``generate`` with transformers' semantics, compiled whole: prefill plus the decode loop in one XLA program.

Shapes are bucketed (batch to powers of two, prompt and new-token counts to powers of two from 16) so a
stream of different requests compiles a bounded number of programs; the token count itself, the sampling
settings and the seed are traced values. Prompts are left-padded into their bucket; padding slots are
masked, so a padded prompt produces the tokens it produces alone. Sampling and EOS handling run on
device; the host sees the result once, or once per chunk when a streamer is given.

On a mesh, prompt rows are split over the batch axes (``data``, ``fsdp``), the KV cache over rows and heads
(``mesh.cache_sharding``), and the tokens handed back are whole on every device, so every process of a
multi-host mesh reads the same result.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hfax import masks
from hfax.backends.jax import mesh, monitor
from hfax.backends.jax.cache import SlotCache, buffer_dtype
from hfax.backends.jax.runtime import env, to_array, to_tensor
from hfax.generation import MIN_LENGTH_BUCKET, STREAM_CHUNK, GenerateStats, accepts, bucket, check_streamer, pad_prompts, resolve


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything about one generate program that fixes its shape or structure (hashable, for ``jax.jit``)."""

    capacity: int
    do_sample: bool
    windows: tuple[tuple[str, int | None], ...]
    pass_positions: bool
    logits_to_keep: bool


def _step(model: Any, static: Static, params: Any, buffers: Any, ids: Any, positions: Any, valid: Any, slots: Any) -> Any:
    """One forward over ``ids`` written at ``slots`` of a cache of ``valid.shape[1]`` slots."""
    tparams, tids, tpositions, tvalid, tslots, tbuffers = to_tensor((params, ids, positions, valid, slots, buffers))
    with env():
        tmask = masks.build(dict(static.windows), tvalid, tslots, model.module.dtype)
        dtype = buffer_dtype(model.dtype, model.platform)
        cache = SlotCache(valid.shape[1], tslots[0], tbuffers, in_place=model.mesh is None, dtype=dtype)
        kwargs: dict[str, Any] = dict(input_ids=tids, attention_mask=tmask, past_key_values=cache, use_cache=True)
        if static.pass_positions:
            kwargs["position_ids"] = tpositions
        if static.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        output = torch.func.functional_call(model.module, tparams, (), kwargs, tie_weights=True, strict=False)
        logits = output.logits[:, -1, :]
        new_buffers = to_array(cache.buffers(after=output.logits))
    if model.mesh is not None:  # heads over `model`, rows over the batch axes, in prefill and every decode step
        new_buffers = mesh.constrain(new_buffers, functools.partial(mesh.cache_sharding, model.mesh))
    return to_array(logits).astype(jnp.float32), new_buffers


def _choose(static: Static, logits: jax.Array, index: jax.Array, finished: jax.Array, options: dict[str, Any]) -> tuple[Any, Any]:
    """Pick new token ``index`` of every row, in transformers' order: min-length, temperature, top-k, top-p."""
    vocab = logits.shape[-1]
    is_eos = jnp.isin(jnp.arange(vocab), options["eos"])
    logits = jnp.where((index < options["min_new_tokens"]) & is_eos[None], -jnp.inf, logits)
    if static.do_sample:
        logits = logits / options["temperature"]
        ascending = jnp.sort(logits, axis=-1)
        k = jnp.clip(options["top_k"], 1, vocab)
        kth = jnp.take_along_axis(ascending, jnp.broadcast_to(vocab - k, (logits.shape[0], 1)), axis=-1)
        logits = jnp.where((options["top_k"] > 0) & (logits < kth), -jnp.inf, logits)
        # top-p over what top-k left: drop the low-probability tail holding at most 1 - top_p of the mass.
        order = jnp.argsort(logits, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1), axis=-1)
        drop_sorted = (cumulative <= 1 - options["top_p"]).at[:, -1].set(False)
        drop = jnp.zeros_like(drop_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(drop_sorted)
        logits = jnp.where(drop, -jnp.inf, logits)
        token = jax.random.categorical(jax.random.fold_in(jax.random.wrap_key_data(options["key"]), index), logits, axis=-1)
    else:
        token = jnp.argmax(logits, axis=-1)
    token = jnp.where(finished, options["pad"], token.astype(jnp.int32))
    return token, finished | jnp.isin(token, options["eos"])


def prefill(model: Any, static: Static, params: Any, ids: jax.Array, prompt_mask: jax.Array, options: dict[str, Any]) -> dict[str, Any]:
    """Run the prompt, fill the cache, and choose the first new token."""
    batch, length = ids.shape
    valid = jnp.concatenate([prompt_mask, jnp.ones((batch, static.capacity), bool)], axis=1)
    positions = jnp.where(prompt_mask, jnp.cumsum(prompt_mask, axis=1) - 1, 1)
    logits, buffers = _step(model, static, params, None, ids, positions, valid, jnp.arange(length))
    token, finished = _choose(static, logits, jnp.int32(0), jnp.zeros((batch,), bool), options)
    tokens = jnp.full((batch, static.capacity), options["pad"], jnp.int32).at[:, 0].set(token)
    return {"buffers": buffers, "tokens": tokens, "step": jnp.int32(1), "finished": finished, "valid": valid}


def decode(model: Any, static: Static, params: Any, state: dict[str, Any], limit: jax.Array, options: dict[str, Any]) -> dict[str, Any]:
    """Choose new tokens ``state["step"]`` up to ``limit`` (or until every row finished), in one while loop."""
    prompt_length = state["valid"].shape[1] - static.capacity
    seen = jnp.sum(state["valid"][:, :prompt_length], axis=1)

    def unfinished(state: dict[str, Any]) -> jax.Array:
        return (state["step"] < limit) & ~jnp.all(state["finished"])

    def advance(state: dict[str, Any]) -> dict[str, Any]:
        step = state["step"]
        last = jax.lax.dynamic_slice_in_dim(state["tokens"], step - 1, 1, axis=1)
        slot = prompt_length + step - 1
        logits, buffers = _step(
            model, static, params, state["buffers"], last, (seen + step - 1)[:, None], state["valid"], slot[None]
        )
        token, finished = _choose(static, logits, step, state["finished"], options)
        tokens = jax.lax.dynamic_update_slice_in_dim(state["tokens"], token[:, None], step, axis=1)
        return {**state, "buffers": buffers, "tokens": tokens, "step": step + 1, "finished": finished}

    state = jax.lax.while_loop(unfinished, advance, state)
    if model.mesh is not None:  # whole on every device, so every process of a multi-host mesh can read them
        whole = jax.sharding.NamedSharding(model.mesh, jax.sharding.PartitionSpec())
        state = {**state, **mesh.constrain({key: state[key] for key in ("tokens", "finished")}, lambda shape: whole)}
    return state


def _generate_all(model: Any, params: Any, ids: Any, prompt_mask: Any, limit: Any, options: Any, static: Static) -> Any:
    state = decode(model, static, params, prefill(model, static, params, ids, prompt_mask, options), limit, options)
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
    seed: int | None = None,
    streamer: Any = None,
) -> jax.Array:
    """Continue ``input_ids`` (``[batch, length]``, left-padded when lengths differ) on device.

    Returns the prompt followed by ``max_new_tokens`` new tokens, ``[batch, length + max_new_tokens]``; a
    row that produced EOS continues with ``pad_token_id``. Unset arguments come from the model's
    ``generation_config``, as in transformers. Greedy unless ``do_sample``; sampling is reproducible for a
    given ``seed``. A ``streamer`` (``put``/``end``, e.g. ``transformers.TextStreamer``) receives tokens in
    chunks of ``STREAM_CHUNK`` as they are decoded.
    """
    settings = dict(
        max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, min_new_tokens=min_new_tokens, seed=seed,
    )  # fmt: skip
    ids, mask, s = resolve(model, input_ids, attention_mask, settings)
    check_streamer(streamer)
    batch = ids.shape[0]
    max_new = int(s["max_new_tokens"])
    started, before = time.perf_counter(), monitor.snapshot()
    if max_new == 0:
        if streamer is not None:
            streamer.put(ids)
            streamer.end()
        return jax.device_put(ids.astype(np.int32))

    args, static = _arguments(model, ids, mask, s)
    if streamer is None:
        tokens, steps = model.program("generate", _generate_all)(*args, static=static)
        tokens = np.asarray(tokens)
    else:
        tokens, steps = _stream(model, static, args, max_new, streamer, ids)
    after = monitor.snapshot()
    model.last_generate_stats = GenerateStats(
        new_tokens=int(steps) * batch,
        seconds=time.perf_counter() - started,
        compile_seconds=(after.compile_seconds - before.compile_seconds) + (after.trace_seconds - before.trace_seconds),
        compiles=after.compiles - before.compiles,
    )
    return jax.device_put(np.concatenate([ids, tokens[:batch, :max_new]], axis=1).astype(np.int32))


def _arguments(model: Any, ids: np.ndarray, mask: np.ndarray, s: dict[str, Any]) -> tuple[tuple[Any, ...], Static]:
    """The generate program's arguments ``(params, ids, prompt_mask, limit, options)`` and its ``Static``.

    Prompts are left-padded into their bucket, with rows enough for every batch axis of the mesh, and split
    over those axes; the settings are replicated.
    """
    padded_ids, padded_mask = pad_prompts(ids, mask, s["pad_token_id"], mesh.batch_multiple(model.mesh))
    static = Static(
        capacity=bucket(int(s["max_new_tokens"]), MIN_LENGTH_BUCKET),
        do_sample=bool(s["do_sample"]),
        windows=tuple(sorted(masks.layer_windows(model.config).items())),
        pass_positions=accepts(model.module, "position_ids"),
        logits_to_keep=accepts(model.module, "logits_to_keep"),
    )
    options = {
        "temperature": np.float32(s["temperature"]),
        "top_k": np.int32(s["top_k"]),
        "top_p": np.float32(s["top_p"]),
        "min_new_tokens": np.int32(s["min_new_tokens"]),
        "eos": np.asarray(s["eos_token_id"] or [-1], np.int32),
        "pad": np.int32(s["pad_token_id"]),
        "key": np.asarray(jax.random.key_data(jax.random.key(int(s["seed"])))),
    }
    limit, options = mesh.replicate((np.int32(s["max_new_tokens"]), options), model.mesh)
    return (model.params, *mesh.shard_batch((padded_ids, padded_mask), model.mesh), limit, options), static


def lower(model: Any, input_ids: Any, attention_mask: Any = None, **settings: Any) -> jax.stages.Lowered:
    """The program ``generate`` runs for these arguments, lowered but not run.

    ``lower(model, ids, max_new_tokens=8).compile().as_text()`` is the optimized HLO, e.g. to count the
    collectives a mesh costs.
    """
    ids, mask, s = resolve(model, input_ids, attention_mask, settings)
    args, static = _arguments(model, ids, mask, s)
    return model.program("generate", _generate_all).lower(*args, static=static)


def _stream(model: Any, static: Static, args: tuple[Any, ...], max_new: int, streamer: Any, ids: np.ndarray) -> tuple[np.ndarray, int]:
    params, prompt_ids, prompt_mask, _, options = args
    streamer.put(ids)
    state = model.program("prefill", prefill_program)(params, prompt_ids, prompt_mask, options, static=static)
    sent = 0
    while True:
        limit = min(sent + STREAM_CHUNK, max_new)
        limit_array = mesh.replicate(np.int32(limit), model.mesh)
        state = model.program("decode", decode_program, donate=("state",))(params, state, limit_array, options, static=static)
        step = int(state["step"])
        tokens = np.asarray(state["tokens"])
        streamer.put(tokens[: ids.shape[0], sent:step])
        sent = step
        if step >= max_new or bool(np.all(np.asarray(state["finished"]))):
            break
    streamer.end()
    return tokens, sent


def prefill_program(model: Any, params: Any, ids: Any, prompt_mask: Any, options: Any, static: Static) -> Any:
    return prefill(model, static, params, ids, prompt_mask, options)


def decode_program(model: Any, params: Any, state: Any, limit: Any, options: Any, static: Static) -> Any:
    return decode(model, static, params, state, limit, options)
