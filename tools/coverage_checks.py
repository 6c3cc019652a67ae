"""The checks the coverage sweep runs for one architecture, in a worker process (see ``coverage.py``).

Every check compares an hfax backend with the same weights run by plain PyTorch on CPU, in float32:

* ``load``: ``hfax.AutoModelForTPU.from_pretrained`` of the saved tiny model (its ``architectures`` class).
* ``forward``: the pure forward (``model.apply``) run eagerly, logits (or hidden states) within ``TOLERANCE``.
* ``jit``: the compiled forward (``model(...)``), same comparison.
* ``generate``: greedy ``model.generate`` (prefill and decode loop in one program) gives transformers' tokens
  for an unpadded prompt; ``padded``: the same for a left-padded prompt in the same batch.
* ``sharded``: loaded over an 8-device mesh (``hfax.make_mesh(model=8)``), generate (or forward) again.

A check reports ``pass``, ``fail`` (with the first line of the error) or ``skip`` (a check it needs failed).
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any, Callable, Iterator

import numpy as np
import tiny_configs
import torch
import transformers

from hfax.testing import spread_weights

TOLERANCE = 1e-4
NEW_TOKENS = 12
PROMPT = 10
PADDING = 3  # left padding of the second prompt
MESH_DEVICES = 8

#: Per kind: the transformers auto class whose mapping gives the model class, and the checks per backend.
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "causal": ("AutoModelForCausalLM", ("load", "forward", "jit", "generate", "padded", "sharded")),
    "seq2seq": (
        "AutoModelForSeq2SeqLM",
        ("load", "forward", "jit", "generate", "padded", "sharded"),
    ),
    "encoder": ("AutoModel", ("load", "forward", "jit", "sharded")),
    "classification": ("AutoModelForSequenceClassification", ("load", "forward", "jit")),
    "image_classification": (
        "AutoModelForImageClassification",
        ("load", "forward", "jit", "sharded"),
    ),
}
#: Kinds whose models read images (``pixel_values``) instead of token ids, and the side the images get.
IMAGE_KINDS = {"image_classification": 32}


class Mismatch(AssertionError):
    """hfax ran but disagrees with PyTorch."""


def first_line(error: BaseException) -> str:
    """``Type: first line of the message [file:line]``, the line naming the innermost library frame."""
    message = str(error).strip().splitlines()[0][:240] if str(error).strip() else ""
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        parts = frame.filename.split(os.sep)
        for package in ("hfax", "torchax", "transformers", "jax", "torch"):
            if package in parts:
                where = f" [{'/'.join(parts[parts.index(package) :])}:{frame.lineno}]"
                break
        if where:
            break
    name = type(error).__name__
    return f"{name}: {message}{where}" if not isinstance(error, Mismatch) else message


def model_classes(kind: str, model_type: str) -> tuple[Any, Any]:
    """(transformers model class, its config class) for ``model_type`` under ``kind``'s auto class."""
    auto = getattr(transformers, KINDS[kind][0])
    config_class = transformers.CONFIG_MAPPING[model_type]
    model_class = auto._model_mapping[config_class]
    if isinstance(
        model_class, tuple
    ):  # several heads for one config (DeiT's with a teacher): the first
        model_class = model_class[0]
    return model_class, model_class.config_class


def prompt_ids(config: Any, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Token ids avoiding the special tokens, the second row left-padded; with the attention mask and pad id."""
    text = config.get_text_config(decoder=True)
    vocab = getattr(text, "vocab_size", None) or tiny_configs.VOCAB
    special = set()
    for source in (config, text):
        for key, value in source.to_dict().items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                special.update(value if isinstance(value, list) else [value])
    choices = np.array([t for t in range(3, min(vocab, tiny_configs.VOCAB)) if t not in special])
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.choice(choices, size=(batch, PROMPT)), dtype=torch.long)
    mask = torch.ones_like(ids)
    pad = pad_token_id(config)
    if batch > 1:
        ids[1, :PADDING], mask[1, :PADDING] = pad, 0
    return ids, mask, pad


def pad_token_id(config: Any) -> int:
    for source in (config, config.get_text_config(decoder=True)):
        for key in ("pad_token_id", "eos_token_id"):
            value = getattr(source, key, None)
            value = value[0] if isinstance(value, list) and value else value
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0


def eos_token_id(model: Any) -> Any:
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    return (
        eos
        if eos is not None
        else getattr(model.config.get_text_config(decoder=True), "eos_token_id", None)
    )


def compare(name: str, got: Any, want: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Raise :class:`Mismatch` unless ``got`` (a JAX or numpy array) matches ``want`` within ``TOLERANCE``."""
    got = np.asarray(got, dtype=np.float32)
    want = want.detach().float().numpy()
    if got.shape != want.shape:
        raise Mismatch(f"{name} shape {got.shape} != PyTorch {want.shape}")
    if (
        valid is not None
    ):  # only positions holding real tokens (padding rows are implementation-defined)
        keep = valid.numpy().astype(bool)
        got, want = got[keep], want[keep]
    if not np.isfinite(want).all():
        raise Mismatch(f"PyTorch {name} are not finite")
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not diff <= TOLERANCE:
        raise Mismatch(f"{name} differ from PyTorch by {diff:.2e} (tolerance {TOLERANCE:.0e})")


def compare_tokens(got: Any, want: torch.Tensor, row: int, start: int = PROMPT) -> None:
    """hfax always returns ``start`` + NEW_TOKENS columns (the prompt, or an encoder-decoder's start token);
    transformers may stop early at EOS: compare the new tokens on its length."""
    got = np.asarray(got)
    want = want.numpy()
    if got.shape[1] < want.shape[1]:
        raise Mismatch(f"hfax returned {got.shape[1]} tokens, transformers {want.shape[1]}")
    a, b = got[row, start : want.shape[1]], want[row, start:]
    if not np.array_equal(a, b):
        step = int(np.argmax(a != b))
        raise Mismatch(
            f"tokens differ from new token {step}: hfax {a[step : step + 4].tolist()} vs transformers {b[step : step + 4].tolist()}"
        )


class Run:
    """Results of one architecture: ``status[check] = pass|fail|skip``, ``errors[check] = first line``."""

    def __init__(self, report: Callable[[str, str, str], None]) -> None:
        self.status: dict[str, str] = {}
        self.report = report

    def check(self, name: str, fn: Callable[[], Any], needs: tuple[str, ...] = ()) -> Any:
        missing = [n for n in needs if self.status.get(n) != "pass"]
        if missing:
            self.status[name] = "skip"
            self.report(name, "skip", f"needs {missing[0]}")
            return None
        try:
            value = fn()
        except BaseException as error:  # noqa: BLE001 - any failure of the model is a result, not a crash
            if isinstance(error, KeyboardInterrupt):
                raise
            self.status[name] = "fail"
            self.report(name, "fail", first_line(error))
            return None
        self.status[name] = "pass"
        self.report(name, "pass", "")
        return value


def run(
    kind: str, model_type: str, backends: list[str], report: Callable[[str, str, str], None]
) -> None:
    """Build the tiny ``model_type`` model, save and reload it, and run ``kind``'s checks on every backend."""
    import hfax

    run = Run(report)
    with tempfile.TemporaryDirectory(prefix=f"hfax-coverage-{model_type}-") as directory:
        reference = run.check("reference", lambda: _reference(kind, model_type, directory))
        if reference is None:
            for backend in backends:
                for check in KINDS[kind][1]:
                    run.check(f"{backend}.{check}", lambda: None, needs=("reference",))
            return
        for backend in backends:
            for name, fn, needs in _backend_checks(hfax, kind, backend, directory, reference):
                run.check(f"{backend}.{name}", fn, needs=tuple(f"{backend}.{n}" for n in needs))


def _load(model_class: Any, directory: str) -> Any:
    torch.manual_seed(0)  # weights missing from a checkpoint are drawn the same way for every load
    return model_class.from_pretrained(directory, dtype=torch.float32).eval()


def _reference(kind: str, model_type: str, directory: str) -> dict[str, Any]:
    """Build, save and reload the tiny model in PyTorch and record what it computes."""
    model_class, config_class = model_classes(kind, model_type)
    if kind in IMAGE_KINDS:
        return _image_reference(kind, model_class, config_class, model_type, directory)
    config = tiny_configs.tiny_config(model_type, config_class=config_class)
    _as_used(kind, config)
    if getattr(model_class, "main_input_name", "input_ids") != "input_ids":
        raise NotImplementedError(
            f"{model_class.__name__} takes {model_class.main_input_name}, not token ids"
        )
    torch.manual_seed(0)
    model = model_class._from_config(config, dtype=torch.float32)
    spread_weights(model)
    model.save_pretrained(directory)
    model = _load(model_class, directory)
    ids, mask, pad = prompt_ids(model.config)
    if kind == "classification" and model.config.is_encoder_decoder:
        ids[:, -1] = (
            model.config.eos_token_id
        )  # they classify from the representation of the last EOS
    inputs: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
    if kind == "seq2seq":
        start = model.generation_config.decoder_start_token_id
        start = start if isinstance(start, int) else pad
        inputs["decoder_input_ids"] = torch.cat([torch.full((2, 1), start), ids[:, -4:]], dim=1)
    with torch.no_grad():
        output = (
            model(**inputs, use_cache=False)
            if "use_cache" in _arguments(model)
            else model(**inputs)
        )
    if not all(
        torch.isfinite(v).all()
        for v in output.values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    ):
        raise ArithmeticError("PyTorch's own output is not finite for these random weights")
    result: dict[str, Any] = {"inputs": inputs, "pad": pad, "eos": eos_token_id(model)}
    if kind == "encoder":
        result["output"], result["valid"] = output.last_hidden_state, mask
    elif kind == "seq2seq":
        result["output"], result["valid"] = output.logits, None
    elif kind == "classification":
        result["output"], result["valid"] = output.logits, None
    else:
        result["output"], result["valid"] = output.logits, mask
    if kind in ("causal", "seq2seq"):
        with torch.no_grad():
            result["tokens"] = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=result["eos"],
            )
    return result


def _image_reference(kind: str, model_class: Any, config_class: Any, model_type: str,
                     directory: str) -> dict[str, Any]:  # fmt: skip
    """The tiny image model's output for two random images of :data:`IMAGE_KINDS`' side."""
    side = IMAGE_KINDS[kind]
    overrides = {"image_size": side, "num_labels": 3}
    config = tiny_configs.tiny_config(model_type, config_class=config_class)
    for key, value in overrides.items():
        if hasattr(config, key) or key == "num_labels":
            setattr(config, key, value)
    if getattr(model_class, "main_input_name", "pixel_values") != "pixel_values":
        raise NotImplementedError(f"{model_class.__name__} takes {model_class.main_input_name}")
    torch.manual_seed(0)
    model = model_class._from_config(config, dtype=torch.float32)
    spread_weights(model)
    model.save_pretrained(directory)
    model = _load(model_class, directory)
    channels = getattr(model.config, "num_channels", 3)
    pixels = torch.tensor(np.random.default_rng(0).standard_normal((2, channels, side, side)))
    inputs = {"pixel_values": pixels.float()}
    with torch.no_grad():
        output = model(**inputs)
    if not torch.isfinite(output.logits).all():
        raise ArithmeticError("PyTorch's own output is not finite for these random weights")
    return {"inputs": inputs, "output": output.logits, "valid": None}


def _as_used(kind: str, config: Any) -> None:
    """What a checkpoint of ``kind`` sets that a class's default config leaves out."""
    if kind == "causal" and not config.is_encoder_decoder:
        # Encoders used as causal LMs (BertLMHeadModel, ...) attend causally only with is_decoder, as
        # transformers warns; without it every step re-reads the whole sequence both ways.
        config.is_decoder = True
    if kind == "classification":
        config.num_labels = 3
    text = config.get_text_config(decoder=True)
    if kind == "classification" and getattr(text, "pad_token_id", None) is None:
        config.pad_token_id = text.pad_token_id = pad_token_id(
            config
        )  # the last real token is found by it
    if config.is_encoder_decoder and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = (
            getattr(config, "pad_token_id", None) or 0
        )  # T5's convention


def _arguments(model: Any) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _output(kind: str, output: Any) -> Any:
    return output.last_hidden_state if kind == "encoder" else output.logits


def _backend_checks(
    hfax: Any, kind: str, backend: str, directory: str, ref: dict[str, Any]
) -> Iterator[tuple[str, Callable[[], Any], tuple[str, ...]]]:
    auto = hfax.AutoModelForTPU  # the class named in the saved config's `architectures`
    checks = KINDS[kind][1]
    arrays = {name: value.numpy() for name, value in ref["inputs"].items()}
    loaded: dict[str, Any] = {}

    def load() -> None:
        torch.manual_seed(0)
        loaded["model"] = auto.from_pretrained(directory, backend=backend, dtype=torch.float32)

    def forward() -> None:
        model = loaded["model"]
        output = model.apply(
            model.params, **{k: _jax(v) for k, v in arrays.items()}, **_no_cache(model)
        )
        compare(_name(kind), _output(kind, output), ref["output"], ref["valid"])

    def jit() -> None:
        compare(_name(kind), _output(kind, loaded["model"](**arrays)), ref["output"], ref["valid"])

    def generate(model: Any) -> Any:
        if "tokens" not in loaded:
            loaded["tokens"] = model.generate(
                arrays["input_ids"],
                attention_mask=arrays["attention_mask"],
                max_new_tokens=NEW_TOKENS,
                pad_token_id=ref["pad"],
                eos_token_id=ref["eos"],
                do_sample=False,
            )
        return loaded["tokens"]

    start = 1 if kind == "seq2seq" else PROMPT

    def generated(row: int) -> Callable[[], None]:
        return lambda: compare_tokens(generate(loaded["model"]), ref["tokens"], row, start)

    def sharded() -> None:
        mesh = hfax.make_mesh(model=MESH_DEVICES)
        torch.manual_seed(0)
        model = auto.from_pretrained(directory, backend=backend, dtype=torch.float32, mesh=mesh)
        if "generate" in checks:
            tokens = model.generate(
                arrays["input_ids"],
                attention_mask=arrays["attention_mask"],
                max_new_tokens=NEW_TOKENS,
                pad_token_id=ref["pad"],
                eos_token_id=ref["eos"],
                do_sample=False,
            )
            compare_tokens(tokens, ref["tokens"], 0, start)
        else:
            compare(_name(kind), _output(kind, model(**arrays)), ref["output"], ref["valid"])

    table = {
        "load": (load, ()),
        "forward": (forward, ("load",)),
        "jit": (jit, ("load",)),
        "generate": (generated(0), ("load",)),
        "padded": (generated(1), ("load",)),
        "sharded": (sharded, ()),
    }
    for name in checks:
        fn, needs = table[name]
        yield name, fn, needs


def _name(kind: str) -> str:
    return "hidden states" if kind == "encoder" else "logits"


def _jax(value: np.ndarray) -> Any:
    from hfax.backends.jax.model import as_jax

    return as_jax(value)


def _no_cache(model: Any) -> dict[str, Any]:
    from hfax.generation.shapes import accepts

    return {"use_cache": False} if accepts(model.module, "use_cache") else {}
