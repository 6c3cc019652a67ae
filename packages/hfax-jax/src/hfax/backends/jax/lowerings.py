"""Lowerings hfax gives torchax: ops whose default lowering hides attention heads from GSPMD, misses
PyTorch's semantics, runs far below the machine's speed on XLA:CPU (``linear`` of a few rows, ``argmax``
over a vocabulary), or does not exist.

torch decomposes a 4-D ``matmul`` (and torchax's reference ``scaled_dot_product_attention`` calls it) into
3-D batched matmuls over ``batch * heads``. Once batch and heads are merged, GSPMD cannot keep heads split
over the ``model`` axis and all-gathers q, k and v in every layer. Lowered straight to ``jnp.matmul``, the
head dimension stays a batch dimension of the dot, and tensor-parallel attention needs no collective: a
decoder layer costs the two all-reduces of its row-parallel projections. Results are unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import torch


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    attn_mask: jax.Array | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> jax.Array:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[..., heads, length, head_dim]`` arrays."""
    if dropout_p:
        raise ValueError(
            f"hfax runs attention for inference only, got dropout_p={dropout_p}; call model.eval() first"
        )
    if (
        query.shape[-3] != key.shape[-3]
    ):  # grouped-query attention: each key/value head serves a group of queries
        groups = query.shape[-3] // key.shape[-3]
        key, value = jnp.repeat(key, groups, axis=-3), jnp.repeat(value, groups, axis=-3)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2)).astype(jnp.float32) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
    if attn_mask is not None:
        scores = (
            jnp.where(attn_mask, scores, -jnp.inf)
            if attn_mask.dtype == jnp.bool_
            else scores + attn_mask
        )
    weights = jax.nn.softmax(scores, axis=-1)
    # A query that may see no key (the row of a left-padding token) gets zeros, as in PyTorch since 2.5;
    # softmax gives NaN there, and the next layer's 0 * NaN spreads it to every token.
    weights = jnp.where(jnp.all(scores == -jnp.inf, axis=-1, keepdims=True), 0.0, weights)
    return jnp.matmul(weights.astype(value.dtype), value)


def grouped_mm(
    mat_a: jax.Array,
    mat_b: jax.Array,
    offs: jax.Array | None = None,
    bias: jax.Array | None = None,
    out_dtype: Any = None,
) -> jax.Array:
    """``torch._grouped_mm``, which torchax lacks: the expert matmuls of a mixture of experts.

    transformers' ``grouped_mm`` experts (the jittable path: tokens sorted by expert, no data-dependent
    shapes) pass ``mat_a`` ``[tokens, in]``, ``mat_b`` ``[experts, in, out]`` and ``offs``, the cumulative
    end row of each expert: ``jax.lax.ragged_dot``. Without ``offs`` the groups are the first dimension of
    two 3-D operands.
    """
    dtype = (
        jnp.dtype(str(out_dtype).removeprefix("torch."))
        if out_dtype is not None
        else jnp.result_type(mat_a, mat_b)
    )
    groups = None
    if offs is None:
        out = jnp.matmul(mat_a, mat_b, preferred_element_type=dtype)
    elif mat_a.ndim == 2 and mat_b.ndim == 3:
        sizes = jnp.diff(offs.astype(jnp.int32), prepend=jnp.zeros((1,), jnp.int32))
        out = jax.lax.ragged_dot(mat_a, mat_b, group_sizes=sizes, preferred_element_type=dtype)
        groups = jnp.searchsorted(offs, jnp.arange(mat_a.shape[0]), side="right")
    else:
        raise NotImplementedError(
            f"torch._grouped_mm of {mat_a.ndim}-D by {mat_b.ndim}-D operands with offs is not lowered; hfax lowers the "
            "mixture-of-experts forward form (2-D tokens by 3-D expert weights)"
        )
    if bias is not None:
        out = out + (
            bias[jnp.minimum(groups, bias.shape[0] - 1)]
            if groups is not None and bias.ndim == 2
            else bias
        )
    return out.astype(dtype)


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``torch.matmul``, accumulating 16-bit floats in float32 (see :func:`linear`)."""
    dtype = jnp.result_type(a, b)
    return jnp.matmul(a, b, preferred_element_type=_accumulator(dtype)).astype(dtype)


def linear(input: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``torch.nn.functional.linear``, accumulating 16-bit floats in float32.

    The result is rounded to the inputs' type once, as XLA's own 16-bit dots do on every backend. Asked
    for a bfloat16 result, XLA:CPU instead converts both operands to float32 first: the weights too,
    costing more memory traffic than the product (in a loop the conversion is hoisted, but then a
    program's every call converts every weight). Asked for float32 accumulation it multiplies bfloat16
    weights as they are wherever its kernels can (two rows and more); for one row in a CPU decode loop, see
    :func:`row_products`.
    """
    dtype = jnp.result_type(input, weight)
    accumulator = _accumulator(dtype)
    rows = math.prod(input.shape[:-1])
    if _ROW_PRODUCTS.get() and accumulator is not None and weight.ndim == 2 and rows == 1:
        output = jnp.dot(input, weight.T, preferred_element_type=accumulator)
    elif accumulator is None and weight.ndim == 2 and _columns_first(rows):
        flat = input.reshape(rows, input.shape[-1])
        output = jax.lax.optimization_barrier(weight @ flat.T).T
        output = output.reshape(*input.shape[:-1], weight.shape[0])
    else:
        output = jnp.einsum("...a,ba->...b", input, weight, preferred_element_type=accumulator)
    output = output.astype(dtype)
    return output if bias is None else output + bias


#: The most rows :func:`_columns_first` computes column by column.
COLUMNS_FIRST_ROWS = 64


def _columns_first(rows: int) -> bool:
    """Whether a float32 ``linear`` of ``rows`` rows is computed as ``(weight @ input.T).T`` with the
    product laid out ``[out, rows]``: on XLA:CPU, for 2 to :data:`COLUMNS_FIRST_ROWS` rows. Its dot emitter
    multiplies a few rows by an ``[out, in]`` weight into ``[rows, out]`` well below the speed it reaches
    when the many ``out`` columns come first (a decode step's projections and vocabulary head over 16
    rows: about half the time; one row is a matrix-vector product, fast either way). The barrier keeps
    XLA from folding the transpose back into the dot's layout. Results equal the other form's up to rounding (the same products, summed in another
    order). Up to 64 rows: a prefill's hundreds of rows measured slower in whole programs (the barrier
    keeps the transpose from fusing with what follows), though one product alone is faster. bfloat16
    products keep theirs: there the two forms measure alike."""
    return 2 <= rows <= COLUMNS_FIRST_ROWS and jax.default_backend() == "cpu"


_ROW_PRODUCTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hfax_row_products", default=False
)


@contextlib.contextmanager
def row_products(enabled: bool = True) -> Iterator[None]:
    """Within: a 16-bit :func:`linear` of one row is written ``input @ weight.T``, for XLA:CPU decode loops.

    XLA:CPU turns that form into a loop that reads the 16-bit weights and multiplies them in float32 as it
    goes, where the ``einsum`` form becomes a dot that wants float32 weights: converted on every step, or
    once before the loop if the loop lets it hoist the conversion (a float32 copy of every weight, read
    at float32 cost). With the weights carried through the loop (``generation.decode``), the one-row form
    reads half the bytes of float32; for float32 weights, and with more rows, the ``einsum`` form is as
    fast or faster, so it stays (docs/PERFORMANCE.md, "CPU decode layouts", has the measurements).
    """
    token = _ROW_PRODUCTS.set(enabled)
    try:
        yield
    finally:
        _ROW_PRODUCTS.reset(token)


def embedding(
    input: jax.Array, weight: jax.Array, padding_idx: int | None = None, *args: Any, **kwargs: Any
) -> jax.Array:
    """``torch.nn.functional.embedding`` (inference: ``padding_idx`` only matters to gradients).

    16-bit rows are gathered through an integer view: XLA widens a gather whose result is widened (as every
    decoder's first norm widens its input) by converting the whole table first, hoisted out of the decode
    loop but paid by every call: a float32 copy of the vocabulary, for a few rows.
    """
    if jnp.issubdtype(weight.dtype, jnp.floating) and jnp.finfo(weight.dtype).bits == 16:
        rows = jnp.take(jax.lax.bitcast_convert_type(weight, jnp.uint16), input, axis=0)
        return jax.lax.bitcast_convert_type(rows, weight.dtype)
    return jnp.take(weight, input, axis=0)


def _accumulator(dtype: Any) -> Any:
    return (
        jnp.float32 if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32 else None
    )


#: The fewest elements along the reduced axis for which :func:`argmax` reduces block by block.
BLOCKED_ARGMAX_FROM = 4096


def argmax(input: jax.Array, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    """``torch.argmax``: the index of the first largest value (a NaN counts as largest).

    On XLA:CPU ``jnp.argmax`` over a long axis is one reduction of (value, index) pairs, which its loop
    emitter runs an element at a time: a decode step's choice over Gemma 3's 262,144 tokens took 1.2 ms
    for one row and 9.4 ms for 16 rows, beside a vocabulary head of 23 and 43 ms (docs/PERFORMANCE.md,
    "Choosing a token block by block"). So there, over an axis of :data:`BLOCKED_ARGMAX_FROM` floats or
    more, the axis is cut into blocks of about its square root: each block's maximum (a plain reduction,
    which vectorizes), the first block whose maximum is the largest, then the argmax inside that block
    alone. The index is the same: the first largest value lies in the first block holding the largest
    maximum, and ``max`` propagates a NaN just as ``argmax`` ranks it first. An axis the blocks do not
    divide is padded at its end with minus infinity, which never comes before a real element."""
    size = input.shape[dim] if dim is not None and input.ndim else input.size
    if (
        size < BLOCKED_ARGMAX_FROM
        or not jnp.issubdtype(input.dtype, jnp.floating)
        or jax.default_backend() != "cpu"
    ):
        if input.ndim == 0:  # torch takes dim 0 or -1 of a 0-d tensor
            return jnp.argmax(input[None], axis=dim, keepdims=keepdim).squeeze()
        return jnp.argmax(input, axis=dim, keepdims=keepdim)
    if dim is None:
        index = argmax(input.reshape(-1), 0)
        return index.reshape((1,) * input.ndim) if keepdim else index
    block = 1 << (int(math.log2(size)) // 2)
    blocks = -(-size // block)
    values = jnp.moveaxis(input, dim, -1)
    if blocks * block != size:
        padding = [(0, 0)] * (values.ndim - 1) + [(0, blocks * block - size)]
        values = jnp.pad(values, padding, constant_values=-jnp.inf)
    values = values.reshape(*values.shape[:-1], blocks, block)
    best = jnp.argmax(values.max(-1), -1)
    inside = jnp.take_along_axis(values, best[..., None, None], -2)[..., 0, :]
    index = best * block + jnp.argmax(inside, -1)
    return jnp.expand_dims(index, dim) if keepdim else index


def is_all_true(condition: jax.Array) -> jax.Array:
    """``torch._check_tensor_all``'s test, with which transformers checks traced values (a VLM's image tokens
    against its image features). A traced condition cannot stop a compiled program, so it reads as true: the
    check is skipped under ``jit``, as ``TRANSFORMERS_DISABLE_TORCH_CHECK=1`` skips it in PyTorch."""
    if isinstance(condition, jax.core.Tracer):
        with jax.ensure_compile_time_eval():  # concrete: torch's check reads it with `.item()`
            return jnp.array(True)
    return jnp.all(condition)


#: torch functions and the JAX functions hfax lowers them to.
LOWERINGS: dict[Any, Callable[..., jax.Array]] = {
    torch.matmul: matmul,
    torch.Tensor.matmul: matmul,
    torch.Tensor.__matmul__: matmul,
    torch.nn.functional.linear: linear,
    torch.nn.functional.embedding: embedding,
    torch.nn.functional.scaled_dot_product_attention: scaled_dot_product_attention,
    torch._grouped_mm: grouped_mm,
    torch.ops.aten._grouped_mm.default: grouped_mm,
    torch.ops.aten._is_all_true.default: is_all_true,
    torch.ops.aten.argmax.default: argmax,
}


def _copy_from_views(environment: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.copy_`` whose source is a torchax view (Mamba's ``conv_state.copy_(x[:, :, -n:])``): torchax's
    own lowering reads the source's array directly, which a view does not have."""

    def copy_(target: Any, source: Any, non_blocking: bool = False) -> Any:
        if hasattr(source, "parent") and hasattr(source, "torch"):  # a torchax View: materialize it
            source = source.torch()
        return original(target, source, env=environment)

    return copy_


def _indices(environment: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.__getitem__`` with indices torchax cannot take as they are:

    - index tensors made on the CPU (SAM's and GOT-OCR2's relative positions, ``table[torch.arange(n)[:, None]
      - ...]``): PyTorch indexes an accelerator's tensor with CPU indices, torchax refuses them as mixed
      math. They become constants on the JAX device.
    - a slice between two counts of one decode step (BERT's ``position_ids[:, past : past + n]`` as the
      decoder of an ``EncoderDecoderModel``, :class:`hfax.backends.jax.cache.CacheLength`): a traced start
      has no static slice, so the same elements are gathered by their positions, ``n`` of them. Only where
      the count's largest value keeps the slice inside the dimension (a slice would shorten there, a
      gather clamp) and no other index is a tensor."""

    def on_device(index: Any) -> Any:
        if type(index) is torch.Tensor and index.ndim:  # a 0-d one torchax reads as a Python number
            return environment.j2t_iso(jax.numpy.asarray(index.numpy()))
        return index

    def counted(index: Any, size: int) -> Any:
        if not isinstance(index, slice) or index.step not in (None, 1):
            return index
        start, stop = index.start, index.stop
        if (
            getattr(start, "range_to", None) is None
            or getattr(stop, "bounds", (0, size + 1))[1] > size
        ):
            return index
        span = start.range_to(stop)
        return index if span is None else span

    def getitem(self: Any, indexes: Any) -> Any:
        if isinstance(indexes, (tuple, list)):
            indexes = type(indexes)(on_device(index) for index in indexes)
            if not any(
                isinstance(index, torch.Tensor) or index is None or index is Ellipsis
                for index in indexes
            ):
                indexes = type(indexes)(
                    counted(index, size) for index, size in zip(indexes, self.shape)
                ) + type(indexes)(indexes[len(self.shape) :])
        elif isinstance(indexes, slice) and self.ndim:
            indexes = counted(indexes, self.shape[0])
        return original(self, on_device(indexes))

    return getitem


def _cache_ranges(environment: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.arange(past, past + n)`` over a decode step's cache length
    (:class:`hfax.backends.jax.cache.CacheLength`): ``n`` positions from the traced count, a static shape.
    Any other range is torchax's (a JAX function: it takes and gives JAX values)."""

    def arange(*args: Any, **kwargs: Any) -> Any:
        start = args[0] if args else kwargs.get("start")
        if (span := getattr(start, "range_to", None)) is not None:
            end = args[1] if len(args) > 1 else kwargs.pop("end", None)
            step = args[2] if len(args) > 2 else kwargs.pop("step", None)
            if (result := span(end, step, **kwargs)) is not None:
                return result
        args, kwargs = environment.t2j_iso((args, kwargs))
        return environment.j2t_iso(original(*args, **kwargs))

    return arange


#: torch operations whose torchax lowering is wrapped: it works on torchax tensors, given its arguments fixed.
WRAPPED: dict[Any, Callable[[Any, Callable[..., Any]], Callable[..., Any]]] = {
    torch.arange: _cache_ranges,
    torch.ops.aten.copy_.default: _copy_from_views,
    torch.Tensor.__getitem__: _indices,
}


def type_as(self: Any, other: Any) -> Any:
    """``Tensor.type_as``: a converted tensor, as in torch. torchax's changes ``self`` in place (a wrong dtype
    wherever else ``self`` is used) and fails when ``other`` is a view (Gemma 3n's norms)."""
    return self.to(other.dtype)


#: Methods of torchax's Tensor class that bypass torch's dispatch, and what replaces them.
METHODS: dict[str, Callable[..., Any]] = {"type_as": type_as}


def _masked_view_writes(original: Callable[..., Any]) -> Callable[..., Any]:
    """``view[mask] = value`` (Longformer's ``extended_mask[:, 0, 0, :][attention_mask == 2] = max``).
    torchax's view hands the index tensor to JAX's indexing unconverted, which refuses it; converted, a
    boolean mask would still select a data-dependent number of elements, which no compiled program has.
    A mask over the view's leading dimensions with one value becomes a ``where`` over the whole view, as
    torchax's own Tensor does it; any other index is torchax's, given JAX arrays."""

    def setitem(self: Any, key: Any, value: Any) -> None:
        key, value = self._env.t2j_iso((key, value))
        mask = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        shape = tuple(self.shape)
        if (
            isinstance(mask, jax.Array)
            and mask.dtype == jnp.bool_
            and tuple(mask.shape) == shape[: mask.ndim]
            and jnp.ndim(value) == 0
        ):
            current = self.jax()
            mask = mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim))
            self.update(new_values=jnp.where(mask, jnp.asarray(value, current.dtype), current))
            return
        original(self, key, value)

    return setitem


#: Methods of torchax's View class (a tensor that writes through to its source) and what wraps them.
VIEW_METHODS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "__setitem__": _masked_view_writes
}


def _attend_written(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """Attention over keys and values a slot-cache write returned, read around the write (``attention.attend``);
    ``None`` for any other call."""
    from hfax.backends.jax import attention

    if is_causal or dropout_p:
        return None
    return attention.around_write_attention(
        query, key, value, attn_mask, 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    )


#: torch functions whose lowering first tries one that needs the torch arguments themselves; ``None`` declines.
TORCH_LOWERINGS: dict[Any, Callable[..., Any]] = {
    torch.nn.functional.scaled_dot_product_attention: _attend_written
}


def install(environment: Any, tensor_class: Any = None, view_class: Any = None) -> None:
    """Register :data:`LOWERINGS` (after :data:`TORCH_LOWERINGS`) and :data:`WRAPPED` in a torchax environment,
    :data:`METHODS` on its ``tensor_class`` and :data:`VIEW_METHODS` on its ``view_class`` (idempotent)."""
    for name, method in METHODS.items():
        if tensor_class is not None:
            setattr(tensor_class, name, method)
    for name, wrap in VIEW_METHODS.items():
        original = getattr(view_class, name, None)
        if original is not None and not getattr(original, "hfax_wrapped", False):
            wrapped = wrap(original)
            wrapped.hfax_wrapped = True
            setattr(view_class, name, wrapped)

    def lowered(function: Any, fn: Callable[..., jax.Array]) -> Callable[..., Any]:
        first = TORCH_LOWERINGS.get(function)

        def run(*args: Any, **kwargs: Any) -> Any:
            if first is not None and (result := first(*args, **kwargs)) is not None:
                return result
            args, kwargs = environment.t2j_iso((args, kwargs))
            return environment.j2t_iso(fn(*args, **kwargs))

        return run

    for function, fn in LOWERINGS.items():
        environment.override_op_definition(function, lowered(function, fn))
    for op, wrap in WRAPPED.items():
        original = environment._ops.get(op) or environment._ops[op.overloadpacket]
        if not getattr(original.func, "hfax_wrapped", False):
            wrapped = wrap(environment, original.func)
            wrapped.hfax_wrapped = True
            environment.override_op_definition(op, wrapped, is_view_op=original.is_view_op)
