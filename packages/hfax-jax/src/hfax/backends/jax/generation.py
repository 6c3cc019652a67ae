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

from hfax.backends.jax import masks, mesh, monitor
from hfax.backends.jax.cache import SlotCache
from hfax.backends.jax.runtime import env, to_array, to_tensor

MIN_LENGTH_BUCKET = 16
STREAM_CHUNK = 8


def bucket(n: int, minimum: int) -> int:
    """The smallest power-of-two multiple of ``minimum`` that holds ``n``."""
    size = minimum
    while size < n:
        size *= 2
    return size


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything about one generate program that fixes its shape or structure (hashable, for ``jax.jit``)."""

    capacity: int
    do_sample: bool
    windows: tuple[tuple[str, int | None], ...]
    pass_positions: bool
    logits_to_keep: bool


@dataclasses.dataclass
class GenerateStats:
    """What the last ``generate`` call did: tokens, wall time, and the compilation inside it."""

    new_tokens: int
    seconds: float
    compile_seconds: float
    compiles: int

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of running (compile and trace time excluded)."""
        running = self.seconds - self.compile_seconds
        return self.new_tokens / running if running > 0 else float("nan")


def _step(model: Any, static: Static, params: Any, buffers: Any, ids: Any, positions: Any, valid: Any, slots: Any) -> Any:
    """One forward over ``ids`` written at ``slots`` of a cache of ``valid.shape[1]`` slots."""
    mask = masks.build(dict(static.windows), valid, slots, model.dtype)
    tparams, tids, tpositions, tmask, tslot, tbuffers = to_tensor((params, ids, positions, mask, slots[0], buffers))
    with env():
        cache = SlotCache(valid.shape[1], tslot, tbuffers)
        kwargs: dict[str, Any] = dict(input_ids=tids, attention_mask=tmask, past_key_values=cache, use_cache=True)
        if static.pass_positions:
            kwargs["position_ids"] = tpositions
        if static.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        output = torch.func.functional_call(model.module, tparams, (), kwargs, tie_weights=True, strict=False)
        logits = output.logits[:, -1, :]
        new_buffers = to_array(cache.buffers())
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


def _as_ids(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer) and not np.issubdtype(array.dtype, np.bool_):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}; pass token ids from the tokenizer")
    return array.astype(np.int64)


def _eos_list(eos: Any) -> list[int]:
    if eos is None:
        return []
    if isinstance(eos, (list, tuple, np.ndarray)):
        return [int(e) for e in eos]
    return [int(eos)]


def _resolve(model: Any, input_ids: Any, attention_mask: Any, settings: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Fill defaults from the model's generation config and reject bad input before anything compiles."""
    config = model.generation_config
    defaults = {
        "do_sample": False,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
        "min_new_tokens": 0,
        "eos_token_id": None,
        "pad_token_id": None,
        "max_new_tokens": None,
        "seed": 0,
    }
    s = {key: settings.get(key) for key in defaults}
    for key, default in defaults.items():
        if s[key] is None:
            s[key] = getattr(config, key, None) if key != "seed" else None
        if s[key] is None:
            s[key] = default
    ids = _as_ids("input_ids", input_ids)
    if s["max_new_tokens"] is None:
        s["max_new_tokens"] = max(int(getattr(config, "max_length", None) or 20) - ids.shape[1], 0)
    max_new = s["max_new_tokens"]
    if isinstance(max_new, bool) or not isinstance(max_new, (int, np.integer)) or max_new < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new!r}")
    if s["do_sample"] and not s["temperature"] > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {s['temperature']!r}; use do_sample=False for greedy")
    if not 0 < s["top_p"] <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {s['top_p']!r}")
    if isinstance(s["top_k"], bool) or not isinstance(s["top_k"], (int, np.integer)) or s["top_k"] < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {s['top_k']!r}")
    if s["min_new_tokens"] < 0:
        raise ValueError(f"min_new_tokens must be >= 0, got {s['min_new_tokens']!r}")
    vocab = model.module.get_input_embeddings().num_embeddings
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer matches the model")
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions and ids.shape[1] + max_new > max_positions:
        raise ValueError(
            f"prompt ({ids.shape[1]} tokens) plus max_new_tokens ({max_new}) exceeds the model's "
            f"max_position_embeddings ({max_positions}); shorten the prompt or ask for fewer tokens"
        )
    eos = _eos_list(s["eos_token_id"])
    if s["pad_token_id"] is None or s["pad_token_id"] == []:
        s["pad_token_id"] = eos[0] if eos else 0
    s["eos_token_id"] = eos
    if attention_mask is None:
        # transformers infers padding from the pad token when it cannot be mistaken for EOS.
        pad = s["pad_token_id"]
        infer = pad is not None and pad not in eos and (ids == pad).any()
        mask = (ids != pad) if infer else np.ones_like(ids, dtype=bool)
    else:
        mask = _as_ids("attention_mask", attention_mask)
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask has shape {mask.shape} but input_ids has {ids.shape}")
        if not np.isin(mask, (0, 1)).all():
            raise ValueError("attention_mask must hold only 0 and 1")
        mask = mask.astype(bool)
    return ids, mask, s


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
    ids, mask, s = _resolve(model, input_ids, attention_mask, settings)
    if streamer is not None and not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError("streamer must have put() and end() methods, like transformers.TextStreamer")
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
    batch, length = ids.shape
    rows = mesh.batch_multiple(model.mesh)
    batch_size, prompt_size = -(-bucket(batch, 1) // rows) * rows, bucket(length, MIN_LENGTH_BUCKET)
    padded_ids = np.full((batch_size, prompt_size), s["pad_token_id"], np.int32)
    padded_mask = np.zeros((batch_size, prompt_size), bool)
    padded_ids[:batch, prompt_size - length :], padded_mask[:batch, prompt_size - length :] = ids, mask
    padded_ids[batch:], padded_mask[batch:] = padded_ids[0], padded_mask[0]  # filler rows, discarded
    static = Static(
        capacity=bucket(int(s["max_new_tokens"]), MIN_LENGTH_BUCKET),
        do_sample=bool(s["do_sample"]),
        windows=tuple(sorted(masks.layer_windows(model.config).items())),
        pass_positions=model.accepts("position_ids"),
        logits_to_keep=model.accepts("logits_to_keep"),
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
    ids, mask, s = _resolve(model, input_ids, attention_mask, settings)
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
