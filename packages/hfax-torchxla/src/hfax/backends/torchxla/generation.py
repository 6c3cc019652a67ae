"""``generate`` with transformers' semantics on PyTorch/XLA: a fixed set of XLA programs per shape bucket.

* Shapes are bucketed as in the JAX backend (:mod:`hfax.generation`): rows to powers of two, prompt and
  new-token counts to powers of two from 16; prompts are left-padded into their bucket and the padding is
  masked, so a padded prompt produces the tokens it produces alone.
* The KV cache is transformers' own ``StaticLayer`` for every layer, full length (a sliding window is
  applied by the mask, never by slicing): buffers written in place at a tensor position. Masks are the
  4-D ones of :mod:`hfax.masks`, so transformers never reads a length or syncs with the host.
* Prefill runs once per call as one lazy-tensor graph (one compilation per bucket, then a cache hit); the
  decode step goes through the ``hfax_compile_step`` hook (``torch.compile(backend="openxla")``): dynamo
  traces it once per bucket and every later token runs the cached program without re-tracing Python.
  Measured on the 134M benchmark Llama, that is about twice the speed of a lazy-tensor step loop.
* Sampling and EOS handling run on device. The host syncs once per ``STREAM_CHUNK`` tokens, to stop when
  every row finished and to feed a streamer.
* On CPU, a batched call of :data:`TRANSPOSE_FROM_STEPS` new tokens or more multiplies by an ``[in, out]``
  copy of every ``nn.Linear`` weight, made once per call, float32 for a bfloat16 weight (see
  :func:`in_out_weights`).
* Compiled programs cost host memory that is never given back (on CPU, each maps its code: about 70
  programs of the 134M model exhaust ``vm.max_map_count`` and the process dies in LLVM). A process-wide
  compile budget (``HFAX_TORCHXLA_COMPILE_BUDGET`` programs) bounds them: past it, a request runs in the
  smallest bucket already compiled that holds it, or fails with an error that says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch
import torch_xla
from transformers.cache_utils import Cache, StaticLayer

from hfax import Patcher, masks
from hfax.backends.torchxla import runtime
from hfax.generation import (
    MIN_LENGTH_BUCKET,
    STREAM_CHUNK,
    GenerateStats,
    accepts,
    bucket,
    check_streamer,
    pad_prompts,
    resolve,
)

#: XLA programs a process may compile before generate stops adding buckets (see the module docstring).
DEFAULT_COMPILE_BUDGET = 48
#: Programs one new bucket costs: prefill, the decode step, and the small graph that starts a call.
PROGRAMS_PER_BUCKET = 3
#: EOS id lists are padded to a multiple of this (with -1), so a different EOS count rarely recompiles.
EOS_SLOTS = 4


#: The fewest rows, and new tokens, for which a call on CPU multiplies by ``[in, out]`` weights (:func:`in_out_weights`).
#: Rows: measured (one row is as fast or faster ``[out, in]``). Steps: the JAX backend's threshold for its
#: transposed copy, not measured separately here.
TRANSPOSE_FROM_ROWS = 2
TRANSPOSE_FROM_STEPS = 64
#: The attribute under which an ``nn.Linear`` holds its ``[in, out]`` copy while a call runs.
IN_OUT = "hfax_weight_in_out"


def _linear(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, multiplying by the ``[in, out]`` copy of the weight while a call provides one.

    A float32 copy of a bfloat16 weight multiplies the input widened to float32, and the product is rounded
    back to bfloat16: what XLA:CPU computes for the bfloat16 product itself.
    """
    weight = self.__dict__.get(IN_OUT)
    if weight is None or input.dtype != self.weight.dtype:
        return torch.nn.functional.linear(input, self.weight, self.bias)
    output = torch.matmul(input.to(weight.dtype), weight).to(input.dtype)
    return output if self.bias is None else output + self.bias


def _in_out_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` stored ``[in, out]``; a bfloat16 weight widened to float32 (see :func:`in_out_weights`)."""
    return (
        weight.t()
        .to(torch.float32 if weight.dtype == torch.bfloat16 else weight.dtype)
        .contiguous()
    )


@contextlib.contextmanager
def in_out_weights(model: Any, rows: int, capacity: int) -> Any:
    """Within: on one CPU device, for ``rows`` of two or more and a ``capacity`` of :data:`TRANSPOSE_FROM_STEPS`
    or more, every ``nn.Linear`` of ``model`` multiplies by an ``[in, out]`` copy of its weight.

    torch_xla 2.9's XLA:CPU multiplies a few rows by PyTorch's ``[out, in]`` weight three to seven times
    slower than by the same weight stored ``[in, out]`` (a ``[2048, 768]`` weight, compiled with ``openxla``,
    100 calls, 2-core EPYC; float32, 2 rows: 1.74 against 0.24 ms, 8 rows: 1.16 against 0.26, 32 rows: 1.66
    against 1.26; bfloat16, 8 rows: 1.93 against 0.64). One row is as fast ``[out, in]`` in float32 (0.19
    against 0.15) and much faster in bfloat16 (0.16 against 2.86), so batch 1 keeps it.

    A bfloat16 weight is copied as float32. XLA:CPU has no bfloat16 product: it converts both operands to
    float32 and rounds the result, so every decode step converted every weight again (the benchmark Llama at
    batch 8, prompt 32, a 217 ms step: 268 ms of the two threads' time in conversions, 14 in products, by
    ``torch_xla.debug.profiler``). The float32 copy is that conversion, done once per call, and the tokens
    are the same (the test compares them). At batch 8 bfloat16 went from 37.7 to 106.1 tok/s at prompt 32
    and from 30.2 to 41.1 at prompt 512 (two full runs of ``benchmarks/decode.py``; docs/PERFORMANCE.md's
    later run has 140.4 and 46.0). One row reads bfloat16 weights without converting them; a float32 copy there
    measured slower (31-33 against 35-37 tok/s, alternating runs), so batch 1 keeps the bfloat16 weights.

    The copies are made with the prompt's graph, so they cost one transpose of the weights per call and
    hold memory for it while the call runs (twice the weights' bytes in bfloat16); the modules' own weights
    are untouched. The forwards are patched through ``hfax.Patcher`` (undone by ``hfax.unpatch``); without a
    copy they are ``nn.Linear``'s.
    """
    wanted = (
        runtime.platform() == "CPU"
        and model.mesh is None
        and rows >= TRANSPOSE_FROM_ROWS
        and capacity >= TRANSPOSE_FROM_STEPS
    )
    linears = [m for m in model.module.modules() if type(m) is torch.nn.Linear] if wanted else []
    patcher = Patcher(model.module)
    try:
        for linear in linears:
            patcher.bind(linear, "forward", _linear)
            setattr(linear, IN_OUT, _in_out_copy(linear.weight))
        yield
    finally:
        for linear in linears:
            linear.__dict__.pop(IN_OUT, None)


class CompileBudgetError(RuntimeError):
    """A request needs a new shape bucket, the process's compile budget is spent, and no bucket holds it."""


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The shapes and structure that fix one prefill program and one decode program."""

    batch: int
    prompt: int
    capacity: int
    eos_slots: int
    do_sample: bool

    def holds(self, other: Bucket) -> bool:
        same = (self.batch, self.eos_slots, self.do_sample) == (
            other.batch,
            other.eos_slots,
            other.do_sample,
        )
        return same and self.prompt >= other.prompt and self.capacity >= other.capacity


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
        return min(holding, key=lambda b: (b.prompt + b.capacity, b.prompt))
    raise CompileBudgetError(
        f"this process compiled {runtime.counters().compiles} XLA programs, its budget is {compile_budget()}, and no "
        f"compiled bucket holds batch {wanted.batch}, prompt {wanted.prompt}, {wanted.capacity} new tokens. Each program "
        "keeps host memory (on CPU the process dies in LLVM after about 70 programs of a 134M model), so "
        "hfax stops here. Warm the largest bucket first (a long prompt and max_new_tokens) so later requests fit "
        "in it, or raise HFAX_TORCHXLA_COMPILE_BUDGET if the host has room."
    )


def _logits(
    module: Any,
    cache: Cache,
    ids: Any,
    positions: Any,
    valid: Any,
    query_slots: Any,
    structure: tuple,
) -> Any:
    """One forward over ``ids`` written at ``query_slots`` of the cache; the last position's float32 logits."""
    windows, pass_positions, logits_to_keep = structure
    kwargs: dict[str, Any] = dict(
        input_ids=ids,
        attention_mask=masks.build(dict(windows), valid, query_slots, module.dtype),
        past_key_values=cache,
        use_cache=True,
    )
    if pass_positions:
        kwargs["position_ids"] = positions
    if logits_to_keep:
        kwargs["logits_to_keep"] = 1
    return module(**kwargs).logits[:, -1, :].float()


def _uniform(seed: Any, index: Any, shape: tuple[int, int], device: Any) -> Any:
    """Uniform noise in (0, 1) as a pure function of ``(seed, index, row, column)``: a counter-based hash
    (murmur3's finalizer over 32-bit lanes), so sampling needs no RNG state and is the same on every run."""
    counter = torch.arange(shape[0] * shape[1], device=device).view(shape)
    x = (counter + seed * 0x9E3779B1 + index * 0x85EBCA77) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    x = ((x ^ (x >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return (x.float() + 0.5) / 2.0**32


def choose(
    logits: Any, index: Any, finished: Any, options: dict[str, Any], do_sample: bool
) -> tuple[Any, Any]:
    """Pick new token ``index`` of every row, in transformers' order: min-length, temperature, top-k, top-p.

    EOS membership is a comparison against the padded id list, not ``torch.isin`` (a CPU fallback on XLA).
    """
    batch, vocab = logits.shape
    eos = options["eos"]
    is_eos = (torch.arange(vocab, device=logits.device)[:, None] == eos[None, :]).any(-1)
    logits = logits.masked_fill((index < options["min_new_tokens"]) & is_eos[None, :], -torch.inf)
    if do_sample:
        logits = logits / options["temperature"]
        ascending, order = torch.sort(logits, dim=-1)
        k = options["top_k"].clamp(1, vocab)
        kth = ascending.gather(-1, (vocab - k).view(1, 1).expand(batch, 1))
        logits = logits.masked_fill((options["top_k"] > 0) & (logits < kth), -torch.inf)
        # top-p over what top-k left: drop the low-probability tail holding at most 1 - top_p of the mass.
        ascending = logits.gather(-1, order)
        cumulative = torch.softmax(ascending, dim=-1).cumsum(-1)
        drop_sorted = cumulative <= 1 - options["top_p"]
        drop_sorted[:, -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -torch.inf)
        gumbel = -torch.log(
            -torch.log(_uniform(options["seed"], index, (batch, vocab), logits.device))
        )
        token = torch.argmax(logits + gumbel, dim=-1)
    else:
        token = torch.argmax(logits, dim=-1)
    token = torch.where(finished, options["pad"], token)
    return token, finished | (token[:, None] == eos[None, :]).any(-1)


def decode_step(
    module: Any,
    cache: Cache,
    state: dict[str, Any],
    options: dict[str, Any],
    structure: tuple,
    do_sample: bool,
) -> dict[str, Any]:
    """Choose new token ``state["step"]`` of every row: the program compiled once per bucket.

    ``state`` holds ``tokens`` ``[batch, capacity]``, ``step`` (0-d), ``finished`` ``[batch]``, ``valid``
    ``[batch, prompt + capacity]`` and ``seen`` (real prompt tokens per row); everything is a tensor, so the
    step has no Python value that changes from one token to the next.
    """
    tokens, step = state["tokens"], state["step"]
    batch = tokens.shape[0]
    prompt_length = state["valid"].shape[1] - tokens.shape[1]
    last = tokens.index_select(1, (step - 1).view(1))
    slot = (prompt_length + step - 1).view(1)
    positions = (state["seen"] + step - 1).view(batch, 1)
    logits = _logits(module, cache, last, positions, state["valid"], slot, structure)
    token, finished = choose(logits, step, state["finished"], options, do_sample)
    tokens = tokens.index_copy(1, step.view(1), token.view(batch, 1))
    return {**state, "tokens": tokens, "step": step + 1, "finished": finished}


def prefill(
    module: Any,
    cache: Cache,
    ids: Any,
    valid: Any,
    capacity: int,
    options: dict[str, Any],
    structure: tuple,
    do_sample: bool,
) -> dict[str, Any]:
    """Run the prompt, fill the cache, choose the first new token: the decode loop's first ``state``."""
    batch, length = ids.shape
    prompt_mask = valid[:, :length]
    positions = torch.where(prompt_mask, prompt_mask.long().cumsum(1) - 1, 1)
    logits = _logits(
        module, cache, ids, positions, valid, torch.arange(length, device=ids.device), structure
    )
    zero = torch.zeros((), dtype=torch.long, device=ids.device)
    token, finished = choose(
        logits, zero, torch.zeros(batch, dtype=torch.bool, device=ids.device), options, do_sample
    )
    tokens = torch.cat([token.view(batch, 1), options["pad"].expand(batch, capacity - 1)], dim=1)
    return {
        "tokens": tokens,
        "step": zero + 1,
        "finished": finished,
        "valid": valid,
        "seen": prompt_mask.sum(1),
    }


def _options(s: dict[str, Any], device: Any) -> dict[str, Any]:
    eos = list(s["eos_token_id"]) or [-1]
    eos += [-1] * (-len(eos) % EOS_SLOTS)
    host = {
        "temperature": torch.tensor(float(s["temperature"]), dtype=torch.float32),
        "top_k": torch.tensor(int(s["top_k"])),
        "top_p": torch.tensor(float(s["top_p"]), dtype=torch.float32),
        "min_new_tokens": torch.tensor(int(s["min_new_tokens"])),
        "eos": torch.tensor(eos),
        "pad": torch.tensor(int(s["pad_token_id"])),
        "seed": torch.tensor(int(s["seed"]) & 0xFFFFFFFF),
    }
    return {name: value.to(device) for name, value in host.items()}


def generate(
    model: Any, input_ids: Any, attention_mask: Any = None, *, streamer: Any = None, **settings: Any
) -> torch.Tensor:
    """Continue ``input_ids`` (``[batch, length]``, left-padded when lengths differ) on the XLA device.

    Takes the JAX backend's arguments (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``,
    ``top_p``, ``eos_token_id``, ``pad_token_id``, ``min_new_tokens``, ``seed``), with its defaults and errors
    (:func:`hfax.generation.resolve`). Returns the prompt followed by ``max_new_tokens`` new tokens, ``[batch,
    length + max_new_tokens]`` int64 on the XLA device; a row that produced EOS continues with
    ``pad_token_id``. Greedy unless ``do_sample``; sampling is reproducible for a given ``seed``. A
    ``streamer`` (``put``/``end``) receives CPU tensors in chunks of ``STREAM_CHUNK`` tokens.
    """
    ids, mask, s = resolve(model, input_ids, attention_mask, settings)
    check_streamer(streamer)
    device = runtime.device()
    batch, max_new = ids.shape[0], int(s["max_new_tokens"])
    if streamer is not None:
        streamer.put(torch.from_numpy(ids))
    if max_new == 0:
        if streamer is not None:
            streamer.end()
        return torch.from_numpy(ids).to(device)

    started, before = time.perf_counter(), runtime.counters()
    padded_ids, padded_mask = pad_prompts(ids, mask, s["pad_token_id"])
    wanted = Bucket(
        batch=padded_ids.shape[0],
        prompt=padded_ids.shape[1],
        capacity=bucket(max_new, MIN_LENGTH_BUCKET),
        eos_slots=max(-(-len(s["eos_token_id"]) // EOS_SLOTS), 1) * EOS_SLOTS,
        do_sample=bool(s["do_sample"]),
    )
    chosen = choose_bucket(model.buckets, wanted)
    first_time = chosen not in model.buckets
    model.buckets.add(chosen)
    grow = chosen.prompt - wanted.prompt  # a larger bucket: more left padding, masked like the rest
    padded_ids = np.pad(padded_ids, ((0, 0), (grow, 0)), constant_values=s["pad_token_id"])
    valid = np.concatenate(
        [np.pad(padded_mask, ((0, 0), (grow, 0))), np.ones((chosen.batch, chosen.capacity), bool)],
        1,
    )

    structure = (
        tuple(sorted(masks.layer_windows(model.config).items())),
        accepts(model.module, "position_ids"),
        accepts(model.module, "logits_to_keep"),
    )
    options = _options(s, device)
    cache = Cache(layer_class_to_replicate=lambda: StaticLayer(valid.shape[1]))
    with torch.no_grad(), in_out_weights(model, chosen.batch, chosen.capacity):
        ids_on_device = torch.from_numpy(padded_ids.astype(np.int64)).to(device)
        valid_on_device = torch.from_numpy(valid).to(device)
        state = prefill(
            model.module,
            cache,
            ids_on_device,
            valid_on_device,
            chosen.capacity,
            options,
            structure,
            chosen.do_sample,
        )
        torch_xla.sync()  # prefill is one graph; the decode steps start from materialized tensors
        for layer in cache.layers:
            # transformers marks the buffers as static addresses for CUDA graphs; dynamo would then guard the
            # step on their identity and trace it again for every call's fresh buffers (and keep them alive).
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                torch._dynamo.mark_static_address(tensor, guard=False)
        step_program = model.program("decode", decode_step)
        done, sent, compile_seconds = 1, 0, None
        while True:
            # Whole tensors to the host, sliced there: a slice on device would be one more program per shape.
            if streamer is not None:
                streamer.put(state["tokens"].cpu()[:batch, sent:done])
                sent = done
            if done >= max_new or bool(state["finished"].cpu().all()):
                break
            for _ in range(min(STREAM_CHUNK, max_new - done)):
                state = step_program(
                    model.module, cache, state, options, structure, chosen.do_sample
                )
                if first_time and compile_seconds is None:
                    # A new bucket's prefill and first step trace Python (dynamo) and compile: count them whole.
                    state["step"].cpu()
                    compile_seconds = time.perf_counter() - started
            done = min(done + STREAM_CHUNK, max_new)
        tokens = state["tokens"].cpu()[:batch, :max_new]
    if streamer is not None:
        streamer.end()
    after = runtime.counters() - before
    model.last_generate_stats = GenerateStats(
        new_tokens=done * batch,
        seconds=time.perf_counter() - started,
        compile_seconds=after.compile_seconds if compile_seconds is None else compile_seconds,
        compiles=after.compiles,
    )
    return torch.cat([torch.from_numpy(ids), tokens], dim=1).to(device)
