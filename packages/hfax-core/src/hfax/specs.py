"""The small value types that plugins hand to core (backends, families, claims and sharding plans) and the
:class:`Backend` base class every backend subclasses."""

from __future__ import annotations

import abc
import dataclasses
import importlib
import os
import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from hfax.generation.slots import SlotEngine

#: A per-dimension layout: one mesh axis name (or ``None`` for "not split") per tensor dimension.
Spec = tuple[str | None, ...]

#: The mesh axes hfax understands: batch, gathered-per-layer parameter sharding, tensor parallelism.
MESH_AXES = ("data", "fsdp", "model")


class Backend(abc.ABC):
    """Everything core and the applications (``hfax serve``) may ask of a backend, in one place.

    A backend's plugin names a subclass in its :class:`BackendSpec`; core builds one instance per request
    for the backend and asks only what is declared here, never probing for attributes. ``devices`` and
    ``build`` are what makes a backend, so a subclass must implement them; every other capability has a
    default that says "not offered" in an error naming the backend and the way out, so a new backend
    starts small and overrides what it can do (the way vLLM's ``Platform`` declares a platform's
    capabilities). Tested in packages/hfax-core/tests/test_backends.py.

    Example::

        class MyBackend(hfax.Backend):
            name = "mine"

            def devices(self):
                return ["mine:0"]

            def build(self, model, *, params, family, plan, mesh):
                return MyModel(model, params)
    """

    #: The name users pass as ``backend=`` (the :class:`BackendSpec`'s).
    name: str = ""

    @abc.abstractmethod
    def devices(self) -> Sequence[Any]:
        """The devices this backend would run on here (``hfax env`` prints them)."""

    @abc.abstractmethod
    def build(self, model: Any, *, params: Any, family: str, plan: ShardingPlan, mesh: Any) -> Any:
        """The hfax model for a patched PyTorch ``model`` whose weights ``hfax_shard_weights`` placed as ``params``."""

    def make_mesh(self, **axis_sizes: int) -> Any:
        """``hfax.make_mesh(backend=..., **axis_sizes)``: a device mesh over every device, with axes among
        :data:`MESH_AXES`. Default: this backend builds none (it takes axis sizes, or a mesh of its own)."""
        raise ValueError(
            f"backend {self.name!r} builds no device mesh; pass its own mesh object as mesh=, or "
            'make_mesh(backend="jax", ...)'
        )

    def adopt_mesh(self, mesh: Any, axis_names: Mapping[str, str] | None = None) -> Any:
        """The user's ``mesh`` as this backend places weights on it, its axes checked and renamed to
        :data:`MESH_AXES` by ``axis_names`` (``{"model": "tp"}``). Default: the mesh as given, and no
        renaming."""
        if axis_names:
            raise ValueError(f"backend {self.name!r} takes no axis_names: name its mesh's axes")
        return mesh

    def serves(self) -> bool:
        """Whether :meth:`serving_engine` builds a continuous-batching engine (``hfax serve`` asks before
        it loads a model). Default: no."""
        return False

    def serving_engine(
        self,
        model: Any,
        *,
        slots: int,
        length: int,
        chunk: int,
        prefixes: int = 0,
        piece: int = 0,
        lookup: int = 0,
    ) -> SlotEngine:
        """A continuous-batching engine over ``model`` (one this backend built): ``slots`` rows of a
        ``length``-column cache, ``chunk`` decode steps per :meth:`~hfax.generation.slots.SlotEngine.decode`,
        a store of ``prefixes`` prompt prefixes (:meth:`~hfax.generation.slots.SlotEngine.keep`; an
        engine may keep fewer, none when it cannot keep them exact), long prompts prefilled in pieces of
        ``piece`` tokens (:meth:`~hfax.generation.slots.SlotEngine.prefill`; 0, or an engine that cannot
        keep them exact: whole), and ``lookup`` tokens a step guessed by prompt lookup when a decode asks
        for guesses (``decode(..., guess=True)``; 0: none).
        A backend that overrides it overrides :meth:`serves` too. Default: refused, naming the backend."""
        raise NotImplementedError(
            f"the {self.name} backend has no continuous-batching engine, so hfax serve cannot run on it; "
            "serve with a backend that has one (-b jax)"
        )


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend as named by its plugin: ``target`` is ``"module:attribute"`` of a :class:`Backend` class."""

    name: str
    target: str
    description: str = ""

    def load(self) -> Backend:
        """Import the backend and return an instance (this is where torch / jax get imported)."""
        module, _, attribute = self.target.partition(":")
        backend = getattr(importlib.import_module(module), attribute)()
        if not isinstance(backend, Backend):
            raise TypeError(
                f"backend {self.name!r} ({self.target}) is a {type(backend).__name__}, not an hfax.Backend: "
                "its plugin must subclass hfax.Backend"
            )
        return backend


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """A model family: its name, the ``model_type`` values it claims, the transformers versions tested,
    and the ``features`` its tested models allow a backend to use (the backend's own patch hook acts on
    them, so a family never imports a backend):

    * ``"attention_interface"``: attention goes through transformers' ``AttentionInterface`` with nothing
      model-specific beside it, so a backend may switch it to its own kernel.
    * ``"streamed_loading"``: a safetensors checkpoint holds every weight as the model uses it (transformers'
      loading re-initializes none after reading it), so ``from_pretrained`` may read the weights straight
      onto the devices (``hfax_load_weights``).
    """

    name: str
    model_types: tuple[str, ...] = ()
    transformers: str = ""
    features: tuple[str, ...] = ()


#: The attention of a family with this feature may be switched to a backend's own kernel.
ATTENTION_INTERFACE = "attention_interface"

#: The weights of a family with this feature may be read from the checkpoint straight onto the devices.
STREAMED_LOADING = "streamed_loading"


@dataclasses.dataclass(frozen=True)
class Claim:
    """A plugin's answer to ``hfax_detect_model``; the highest ``priority`` wins."""

    family: str
    priority: int = 0


# transformers' tensor-parallel styles, as the dimension of a weight they split (Linear weights are
# [out_features, in_features]: colwise splits outputs, rowwise splits inputs). Biases follow the output.
_STYLE_DIM = {
    "colwise": 0,
    "colwise_gather_output": 0,
    "packed_colwise": 0,
    "local_colwise": 0,
    "rowwise": 1,
    "rowwise_split_input": 1,
    "packed_rowwise": 1,
    "local_rowwise": 1,
    "embedding_rowwise": 0,
}


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Ordered rules ``(regex over state_dict names, Spec)``; the first match wins, no match replicates.

    ``units`` are ``(regex, n)`` pairs: a matching tensor is split over ``model`` only into pieces holding a
    whole number of ``n``-element blocks, so an attention projection is split between heads, never inside
    one (a model with fewer key/value heads than the ``model`` axis keeps its k/v projections whole).
    """

    rules: tuple[tuple[str, Spec], ...] = ()
    units: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_tp_styles(
        cls, styles: Mapping[str, str], prefix: str = "", units: Mapping[str, int] | None = None
    ) -> ShardingPlan:
        """Build a plan from a transformers ``tp_plan`` (``{"layers.*.mlp.up_proj": "colwise", ...}``).

        ``prefix`` is where the plan's module paths start inside the full model (``"model."`` for the base
        model of a ``*ForCausalLM``); a ``*`` stands for a layer index. Styles that do not split a weight
        (``"gather"``, ``"sequence_parallel"``, ...) replicate it. ``units`` maps a module path of ``styles``
        to the block size its split must respect (an attention projection's ``head_dim``).
        """
        rules, unit_rules = [], []
        for path, style in styles.items():
            dim = _STYLE_DIM.get(style)
            if dim is None:
                continue
            module = re.escape(prefix + path).replace(r"\*", r"\d+")
            weight: list[str | None] = [None, None]
            weight[dim] = "model"
            rules.append((rf"(^|\.){module}\.weight$", tuple(weight)))
            if dim == 0:
                rules.append((rf"(^|\.){module}\.bias$", ("model",)))
            if units and units.get(path, 1) > 1:
                unit_rules.append((rf"(^|\.){module}\.(weight|bias)$", units[path]))
        return cls(tuple(rules), tuple(unit_rules))

    def spec_for(self, name: str, ndim: int) -> Spec:
        """The layout of parameter ``name`` with ``ndim`` dimensions (all ``None`` = replicated)."""
        for pattern, spec in self.rules:
            if re.search(pattern, name) and len(spec) == ndim:
                return spec
        return (None,) * ndim

    def unit_for(self, name: str) -> int:
        """The block size a split of ``name`` over ``model`` must respect (1: any even split)."""
        return next((unit for pattern, unit in self.units if re.search(pattern, name)), 1)

    def spec_on(self, name: str, shape: tuple[int, ...], sizes: Mapping[str, int]) -> Spec:
        """Where weight ``name`` goes on a mesh of axis ``sizes`` (``{"model": 8}``): what backends place.

        The plan's ``model`` split where the mesh has that axis and it divides the dimension into whole units
        (heads, for attention projections), then, for matrices, ``fsdp`` over the largest remaining dimension
        it divides; anything else is replicated (vectors too: gathering a norm's weight costs more than it saves).
        """
        spec: list[str | None] = []
        unit = self.unit_for(name)
        for axis, size in zip(self.spec_for(name, len(shape)), shape):
            whole = sizes.get(axis, 0) if axis is not None else 0
            keep = whole > 0 and size % unit == 0 and (size // unit) % whole == 0
            spec.append(axis if keep else None)
        fsdp = sizes.get("fsdp", 1)
        if fsdp > 1 and len(shape) > 1:
            free = [i for i, axis in enumerate(spec) if axis is None and shape[i] % fsdp == 0]
            if free:
                spec[max(free, key=lambda i: shape[i])] = "fsdp"
        return tuple(spec)

    def describe(self, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, Spec]]:
        """Pair every named shape with its layout, for printing a plan."""
        return [(name, self.spec_for(name, len(shape))) for name, shape in shapes.items()]


class DeviceMemoryError(MemoryError):
    """A model's weights, placed by its sharding plan, would not fit a device."""


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """``"16GB"``, ``"512MiB"``, ``"1e9"`` as bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as 16GB, 512MiB or 1e9, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def configured_device_memory() -> tuple[int | None, str]:
    """``HFAX_DEVICE_MEMORY`` (e.g. ``16GB``) as bytes and its source, or ``(None, "")`` when unset.

    Set, it wins over what a backend reads off its devices (CPU devices report nothing)."""
    configured = os.environ.get("HFAX_DEVICE_MEMORY")
    if not configured:
        return None, ""
    try:
        return parse_size(configured), "HFAX_DEVICE_MEMORY"
    except ValueError as error:
        raise ValueError(f"HFAX_DEVICE_MEMORY: {error}") from None


@dataclasses.dataclass(frozen=True)
class Placement:
    """One tensor on the mesh: its layout (a mesh axis or ``None`` per dimension) and its size, whole and per device."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec
    bytes: int
    bytes_per_device: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a sharding plan puts on every device: one :class:`Placement` per distinct tensor.

    ``mesh`` holds the axis sizes (empty for one device); ``device_memory`` is the bytes one device can
    hold, when known, and ``memory_source`` says where that number came from. ``str(layout)`` is the table
    ``hfax plan`` prints.
    """

    mesh: tuple[tuple[str, int], ...]
    placements: tuple[Placement, ...]
    device_memory: int | None = None
    memory_source: str = ""

    @property
    def bytes(self) -> int:
        """The weights' size, every tensor counted once."""
        return sum(placement.bytes for placement in self.placements)

    @property
    def bytes_per_device(self) -> int:
        """What each device holds (every split is even, so every device holds the same)."""
        return sum(placement.bytes_per_device for placement in self.placements)

    def mesh_name(self) -> str:
        return ",".join(f"{axis}={size}" for axis, size in self.mesh) or "one device"

    def summary(self) -> str:
        """One line: total weight bytes, bytes per device, and the device's memory when known."""
        line = f"weights {_human(self.bytes)}, {_human(self.bytes_per_device)} per device on mesh {self.mesh_name()}"
        if self.device_memory is not None:
            line += f" (a device holds {_human(self.device_memory)}: {self.memory_source})"
        return line

    def check(self) -> None:
        """Raise :class:`DeviceMemoryError`, with the ways out, when the weights do not fit a device."""
        if self.device_memory is None or self.bytes_per_device <= self.device_memory:
            return
        devices = (
            1 << (-(-self.bytes // self.device_memory) - 1).bit_length()
        )  # a power of two, as meshes are
        raise DeviceMemoryError(
            f"the weights need {_human(self.bytes_per_device)} per device on mesh {self.mesh_name()}, but a device holds "
            f"{_human(self.device_memory)} ({self.memory_source}). Split them over more devices (at least {devices}, e.g. "
            f'mesh=hfax.make_mesh(fsdp={devices})), or load a smaller dtype (dtype="bfloat16"); if the device limit '
            "is wrong, set HFAX_DEVICE_MEMORY (e.g. 16GB)."
        )

    def __str__(self) -> str:
        rows = [("tensor", "shape", "dtype", "spec", "per device")]
        for p in self.placements:
            spec = "(" + ", ".join(axis or "-" for axis in p.spec) + ")"
            rows.append(
                (
                    p.name,
                    "x".join(map(str, p.shape)) or "scalar",
                    p.dtype,
                    spec,
                    _human(p.bytes_per_device),
                )
            )
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4]
            for row in rows
        ]
        return "\n".join([*lines, self.summary()])


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} TB"
