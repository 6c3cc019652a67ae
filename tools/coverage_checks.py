"""The checks the coverage sweep runs for one architecture, in a worker process (see ``coverage.py``).

Every check compares an hfax backend with the same weights run by plain PyTorch on CPU, in float32:

* ``load``: ``hfax.AutoModelForTPU.from_pretrained`` of the saved tiny model (its ``architectures`` class).
* ``forward``: the forward run eagerly (JAX: the pure ``model.apply``; torch_xla: the module op by op on the
  device), logits (or hidden states, or start/end logits, or image-text similarities) within ``TOLERANCE``.
* ``jit``: the compiled forward (``model(...)``), same comparison.
* ``generate``: greedy ``model.generate`` (prefill and decode loop in one program) gives transformers' tokens
  for an unpadded prompt; ``padded``: the same for a left-padded prompt in the same batch. Where
  transformers' own padded row differs from the same prompt generated alone (its padding leaks into the
  row: seen for git, glm_moe_dsa and xlm), hfax's padded row passes if it equals the row alone: the tokens
  the attention mask asks for.
* ``sharded``: loaded over an 8-device mesh (``hfax.make_mesh(model=8)``), generate (or forward) again.

Inputs per kind: token ids with one left-padded row; two random images (image kinds; the image-text kinds put
as many image tokens in each prompt as the model makes features of an image); two random clips (audio kinds:
raw samples or log-mel features, by the model's ``main_input_name``).

A check reports ``pass``, ``fail`` (with the first line of the error) or ``skip`` (a check it needs failed).
"""

from __future__ import annotations

import copy
import os
import tempfile
import traceback
from typing import Any, Callable, Iterator

import numpy as np
import torch
import transformers

from hfax.testing import as_numpy, shrink, spread_weights

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
    "masked_lm": ("AutoModelForMaskedLM", ("load", "forward", "jit", "sharded")),
    "token_classification": ("AutoModelForTokenClassification", ("load", "forward", "jit")),
    "question_answering": ("AutoModelForQuestionAnswering", ("load", "forward", "jit")),
    "image_text_to_text": (
        "AutoModelForImageTextToText",
        ("load", "forward", "jit", "generate", "padded", "sharded"),
    ),
    "image_classification": (
        "AutoModelForImageClassification",
        ("load", "forward", "jit", "sharded"),
    ),
    "vision_encoder": ("AutoModel", ("load", "forward", "jit", "sharded")),
    "zero_shot_image_classification": (
        "AutoModelForZeroShotImageClassification",
        ("load", "forward", "jit"),
    ),
    "speech_seq2seq": (
        "AutoModelForSpeechSeq2Seq",
        ("load", "forward", "jit", "generate", "sharded"),
    ),
    "ctc": ("AutoModelForCTC", ("load", "forward", "jit")),
    "audio_classification": ("AutoModelForAudioClassification", ("load", "forward", "jit")),
}
#: Kinds whose models read images (``pixel_values``) instead of token ids, and the side the images get.
IMAGE_KINDS = {
    "image_classification": 32,
    "vision_encoder": 32,
    "zero_shot_image_classification": 32,
}
#: Kinds whose models read audio (``input_values`` or ``input_features``).
AUDIO_KINDS = ("speech_seq2seq", "ctc", "audio_classification")
#: Kinds that generate, and the checks that need a text prompt of token ids.
GENERATING = ("causal", "seq2seq", "image_text_to_text", "speech_seq2seq")
#: Checks a backend cannot run inside a sweep worker, with the reason (rendered as not run).
LEFT_OUT = {
    "torch_xla": {
        # PyTorch/XLA chooses SPMD before a process's first computation, so a mesh needs a process of its
        # own; hfax-torchxla's tests run the sharded forward and generate that way.
        "sharded": "SPMD must be chosen before the process's first computation",
    }
}
AUDIO_SAMPLES = 3200  # raw audio: 10 frames of a 320-sample stride
AUDIO_FRAMES = 32  # log-mel frames where a model has no fixed length


def checks(kind: str, backend: str) -> tuple[str, ...]:
    """The checks ``backend`` runs for ``kind`` (all of the kind's but :data:`LEFT_OUT`)."""
    return tuple(name for name in KINDS[kind][1] if name not in LEFT_OUT.get(backend, {}))


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
    vocab = getattr(text, "vocab_size", None) or shrink.VOCAB
    special = set()
    for source in (config, text):
        for key, value in source.to_dict().items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                special.update(value if isinstance(value, list) else [value])
    choices = np.array([t for t in range(3, min(vocab, shrink.VOCAB)) if t not in special])
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


def compare(name: str, got: Any, want: np.ndarray, valid: torch.Tensor | None = None) -> None:
    """Raise :class:`Mismatch` unless ``got`` matches PyTorch's ``want`` within ``TOLERANCE``."""
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
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
    got = as_numpy(got)
    want = want.numpy()
    if got.shape[1] < want.shape[1]:
        raise Mismatch(f"hfax returned {got.shape[1]} tokens, transformers {want.shape[1]}")
    same_tokens(got[row, start : want.shape[1]], want[row, start:])


def same_tokens(a: np.ndarray, b: np.ndarray) -> None:
    """Raise :class:`Mismatch` at the first new token where hfax's ``a`` and transformers' ``b`` differ."""
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
                for check in checks(kind, backend):
                    run.check(f"{backend}.{check}", lambda: None, needs=("reference",))
            return
        for backend in backends:
            for name, fn, needs in _backend_checks(hfax, kind, backend, directory, reference):
                run.check(f"{backend}.{name}", fn, needs=tuple(f"{backend}.{n}" for n in needs))


def _load(model_class: Any, directory: str) -> Any:
    torch.manual_seed(0)  # weights missing from a checkpoint are drawn the same way for every load
    return model_class.from_pretrained(directory, dtype=torch.float32).eval()


def _saved(model_class: Any, config: Any, directory: str) -> Any:
    """The tiny model with spread random weights, saved to ``directory`` and loaded back."""
    torch.manual_seed(0)
    model = model_class._from_config(config, dtype=torch.float32)
    spread_weights(model)
    model.save_pretrained(directory)
    return _load(model_class, directory)


def _reference(kind: str, model_type: str, directory: str) -> dict[str, Any]:
    """Build, save and reload the tiny model in PyTorch and record what it computes."""
    model_class, config_class = model_classes(kind, model_type)
    config = shrink.shrunk_config(model_type, config_class=config_class)
    _as_used(kind, config)
    expected = {"image_text_to_text": "input_ids", **dict.fromkeys(IMAGE_KINDS, "pixel_values")}
    expected["zero_shot_image_classification"] = "input_ids"  # CLIP-like: text is the main input
    main_input = getattr(model_class, "main_input_name", "input_ids")
    if kind not in AUDIO_KINDS and main_input != expected.get(kind, "input_ids"):
        raise NotImplementedError(f"{model_class.__name__} takes {main_input}, not token ids")
    if kind in IMAGE_KINDS:
        return _image_reference(kind, model_class, config, directory)
    if kind in AUDIO_KINDS:
        return _audio_reference(kind, model_class, config, directory)
    model = _saved(model_class, config, directory)
    ids, mask, pad = prompt_ids(model.config)
    if kind == "classification" and model.config.is_encoder_decoder:
        ids[:, -1] = (
            model.config.eos_token_id
        )  # they classify from the representation of the last EOS
    inputs: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
    if kind == "image_text_to_text":
        inputs = _image_text_inputs(model, ids, mask)
    if kind == "seq2seq":
        start = model.generation_config.decoder_start_token_id
        start = start if isinstance(start, int) else pad
        inputs["decoder_input_ids"] = torch.cat([torch.full((2, 1), start), ids[:, -4:]], dim=1)
    output = _forward(model, inputs)
    # An encoder-decoder's output is its decoder's (Florence-2 among the image-text models), which the
    # source's mask does not describe.
    decoded = kind == "seq2seq" or (
        kind == "image_text_to_text" and model.config.is_encoder_decoder
    )
    valid = None if kind == "classification" or decoded else inputs["attention_mask"]
    result = {"inputs": inputs, "output": _output(kind, output), "valid": valid}
    if kind in GENERATING:
        result.update(_reference_tokens(model, inputs, pad))
        result["start"] = 1 if decoded else inputs["input_ids"].shape[1]
    return result


def _forward(model: Any, inputs: dict[str, torch.Tensor]) -> Any:
    """PyTorch's forward, refusing outputs that are not finite (random weights can overflow)."""
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
    return output


def _well_conditioned(kind: str, model: Any, inputs: dict[str, torch.Tensor], output: Any) -> None:
    """Refuse a reference that float32 rounding alone moves by more than ``TOLERANCE``.

    Deep convolutional stacks (MobileNet's 27 layers, FocalNet) under spread random weights amplify
    rounding layer after layer: PyTorch's own float32 output then differs from its float64 output by up to
    6.0, and no backend can match it within ``TOLERANCE``. Only vision encoders and image classifiers are
    checked: they have no attention masks built from a dtype's minimum, where float64 takes another path.
    A model that does not run in float64 is left unchecked.
    """
    try:
        wide = copy.deepcopy(model).double()
        doubled = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
        with torch.no_grad():
            exact = _output(kind, wide(**doubled))
    except (RuntimeError, TypeError, ValueError):
        return
    error = float(np.max(np.abs(_output(kind, output) - exact)))
    if error > TOLERANCE:
        raise ArithmeticError(
            f"PyTorch's own float32 output differs from float64 by {error:.2e} for these random weights "
            f"(tolerance {TOLERANCE:.0e}): no backend can match it"
        )


def _reference_tokens(model: Any, inputs: dict[str, torch.Tensor], pad: int) -> dict[str, Any]:
    """transformers' greedy tokens for ``inputs`` (without the decoder inputs of the forward)."""
    eos = eos_token_id(model)
    prompt = {name: value for name, value in inputs.items() if name != "decoder_input_ids"}
    with torch.no_grad():
        tokens = model.generate(
            **prompt,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        alone = None
        if set(prompt) == {"input_ids", "attention_mask"} and len(prompt["input_ids"]) > 1:
            row = {name: value[1:, PADDING:] for name, value in prompt.items()}  # no padding
            alone = model.generate(
                **row,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=eos,
            )
            start = 1 if model.config.is_encoder_decoder else row["input_ids"].shape[1]
            alone = alone[0, start:].numpy()
    return {"tokens": tokens, "pad": pad, "eos": eos, "alone": alone}


def _image_text_inputs(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """One image per prompt: random pixels of the vision config's size, and the prompt holding as many
    image tokens as the model makes features of an image (``get_image_features``)."""
    token = _image_token(model.config)
    vision = getattr(model.config, "vision_config", None)
    side = getattr(vision, "image_size", None) or 32
    side = side[0] if isinstance(side, (list, tuple)) else side
    channels = getattr(vision, "num_channels", 3)
    pixels = torch.tensor(np.random.default_rng(1).standard_normal((2, channels, side, side)))
    inputs = {"pixel_values": pixels.float()}
    if not hasattr(model, "get_image_features"):
        raise NotImplementedError(f"{type(model).__name__} has no get_image_features")
    with torch.no_grad():
        features = model.get_image_features(pixel_values=inputs["pixel_values"])
    if hasattr(features, "pooler_output"):  # transformers 5 returns the projected features there
        features = features.pooler_output
    tensors = features if isinstance(features, (list, tuple)) else [features]
    width = model.config.get_text_config(decoder=True).hidden_size
    count = sum(tensor.numel() for tensor in tensors) // width // ids.shape[0]
    inputs.update(_with_image_tokens(ids, mask, token, count))
    return inputs


def _image_token(config: Any) -> int:
    for source in (config, config.get_text_config(decoder=True)):
        for key in ("image_token_id", "image_token_index"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    raise NotImplementedError(f"{type(config).__name__} names no image token (image_token_id)")


def _with_image_tokens(
    ids: torch.Tensor, mask: torch.Tensor, token: int, count: int
) -> dict[str, torch.Tensor]:
    """``count`` image tokens after each prompt's first real token; the left padding kept."""
    image = torch.full((ids.shape[0], count), token)
    ids = torch.cat([ids[:, : PADDING + 1], image, ids[:, PADDING + 1 :]], dim=1)
    mask = torch.cat(
        [mask[:, : PADDING + 1], torch.ones_like(image), mask[:, PADDING + 1 :]], dim=1
    )
    return {"input_ids": ids, "attention_mask": mask}


def _image_reference(kind: str, model_class: Any, config: Any, directory: str) -> dict[str, Any]:
    """The tiny image model's output for two random images of :data:`IMAGE_KINDS`' side."""
    side = IMAGE_KINDS[kind]
    vision = getattr(config, "vision_config", None) or config
    for key, value in {"image_size": side, "num_labels": 3}.items():
        if hasattr(vision, key) or key == "num_labels":
            setattr(vision if key == "image_size" else config, key, value)
    model = _saved(model_class, config, directory)
    channels = getattr(getattr(model.config, "vision_config", model.config), "num_channels", 3)
    pixels = torch.tensor(np.random.default_rng(0).standard_normal((2, channels, side, side)))
    inputs: dict[str, torch.Tensor] = {"pixel_values": pixels.float()}
    if kind == "zero_shot_image_classification":  # two texts scored against both images
        ids, mask, _ = prompt_ids(model.config)
        inputs.update(input_ids=ids, attention_mask=mask)
    output = _forward(model, inputs)
    if kind != "zero_shot_image_classification":  # its text tower masks with a dtype's minimum
        _well_conditioned(kind, model, inputs, output)
    return {"inputs": inputs, "output": _output(kind, output), "valid": None}


def _audio_reference(kind: str, model_class: Any, config: Any, directory: str) -> dict[str, Any]:
    """The tiny audio model's output for two random clips (raw samples or log-mel features)."""
    model = _saved(model_class, config, directory)
    rng = np.random.default_rng(0)
    name = model.main_input_name
    if name == "input_values":
        shape: tuple[int, ...] = (2, AUDIO_SAMPLES)
    elif name == "input_features":
        shape = _feature_shape(model.config)
    else:
        raise NotImplementedError(f"{model_class.__name__} takes {name}, not audio")
    inputs = {name: torch.tensor(rng.standard_normal(shape)).float()}
    pad = pad_token_id(model.config)
    if kind == "speech_seq2seq":
        start = model.generation_config.decoder_start_token_id
        start = start if isinstance(start, int) else pad
        ids, _, _ = prompt_ids(model.config)
        inputs["decoder_input_ids"] = torch.cat([torch.full((2, 1), start), ids[:, -4:]], dim=1)
    output = _forward(model, inputs)
    result = {"inputs": inputs, "output": _output(kind, output), "valid": None}
    if kind == "speech_seq2seq":
        result.update(_reference_tokens(model, inputs, pad))
        result["start"] = 1
    return result


def _feature_shape(config: Any) -> tuple[int, ...]:
    """The ``input_features`` shape a model's feature extractor makes: Whisper-like (batch, mel bins, frames
    fixed by the encoder's positions) or frames first (batch, frames, features)."""
    audio = (
        getattr(config, "audio_config", None) or getattr(config, "encoder_config", None) or config
    )
    mels = getattr(audio, "num_mel_bins", None)
    positions = getattr(audio, "max_source_positions", None)
    if isinstance(mels, int) and isinstance(positions, int):
        return (2, mels, 2 * positions)
    for key in (
        "input_feat_per_channel",
        "feature_projection_input_dim",
        "feature_size",
        "num_mel_bins",
        "input_dim",
    ):
        value = getattr(audio, key, None)
        if isinstance(value, int):
            return (2, AUDIO_FRAMES, value * getattr(audio, "input_channels", 1))
    raise NotImplementedError(f"{type(config).__name__}: no input feature size found")


def _as_used(kind: str, config: Any) -> None:
    """What a checkpoint of ``kind`` sets that a class's default config leaves out."""
    if kind == "causal" and not config.is_encoder_decoder:
        # Encoders used as causal LMs (BertLMHeadModel, ...) attend causally only with is_decoder, as
        # transformers warns; without it every step re-reads the whole sequence both ways.
        config.is_decoder = True
    if kind in ("classification", "token_classification", "audio_classification"):
        config.num_labels = 3
    if kind == "ctc" and getattr(config, "vocab_size", None) is None:
        config.vocab_size = shrink.VOCAB  # a CTC checkpoint sets its alphabet's size
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


def _output(kind: str, output: Any) -> np.ndarray:
    """What ``kind`` compares, as float32 numpy, from a PyTorch or hfax output."""
    if kind in ("encoder", "vision_encoder"):
        value = output.last_hidden_state
    elif kind == "question_answering":  # (batch, tokens, 2): one start and one end logit per token
        return np.stack([as_numpy(output.start_logits), as_numpy(output.end_logits)], axis=-1)
    elif kind == "zero_shot_image_classification":
        value = output.logits_per_image
    else:
        value = output.logits
    return as_numpy(value).astype(np.float32)


def _backend_checks(
    hfax: Any, kind: str, backend: str, directory: str, ref: dict[str, Any]
) -> Iterator[tuple[str, Callable[[], Any], tuple[str, ...]]]:
    auto = hfax.AutoModelForTPU  # the class named in the saved config's `architectures`
    arrays = {name: value.numpy() for name, value in ref["inputs"].items()}
    prompt = {name: value for name, value in arrays.items() if name != "decoder_input_ids"}
    loaded: dict[str, Any] = {}
    label = _name(kind)

    def load() -> None:
        torch.manual_seed(0)
        loaded["model"] = auto.from_pretrained(directory, backend=backend, dtype=torch.float32)

    def forward() -> None:
        compare(label, _output(kind, _eager(loaded["model"], arrays)), ref["output"], ref["valid"])

    def jit() -> None:
        compare(label, _output(kind, loaded["model"](**arrays)), ref["output"], ref["valid"])

    def generate(model: Any) -> Any:
        return model.generate(
            **prompt,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=ref["pad"],
            eos_token_id=ref["eos"],
            do_sample=False,
        )

    def generated(row: int) -> Callable[[], None]:
        def check() -> None:
            if "tokens" not in loaded:
                loaded["tokens"] = generate(loaded["model"])
            try:
                compare_tokens(loaded["tokens"], ref["tokens"], row, ref["start"])
            except Mismatch as padded_mismatch:
                if row == 0 or ref.get("alone") is None:
                    raise
                # transformers' padded row may be the wrong one: then hfax's must equal the row alone.
                alone = ref["alone"]
                got = as_numpy(loaded["tokens"])[row, ref["start"] : ref["start"] + len(alone)]
                try:
                    same_tokens(got, alone)
                except Mismatch:
                    raise padded_mismatch from None

        return check

    def sharded() -> None:
        mesh = hfax.make_mesh(model=MESH_DEVICES)
        torch.manual_seed(0)
        model = auto.from_pretrained(directory, backend=backend, dtype=torch.float32, mesh=mesh)
        if "generate" in KINDS[kind][1]:
            compare_tokens(generate(model), ref["tokens"], 0, ref["start"])
        else:
            compare(label, _output(kind, model(**arrays)), ref["output"], ref["valid"])

    table = {
        "load": (load, ()),
        "forward": (forward, ("load",)),
        "jit": (jit, ("load",)),
        "generate": (generated(0), ("load",)),
        "padded": (generated(1), ("load",)),
        "sharded": (sharded, ()),
    }
    for name in checks(kind, backend):
        fn, needs = table[name]
        yield name, fn, needs


def _eager(model: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The forward without compiling it: JAX's pure ``apply``; torch_xla's module run op by op on device."""
    if hasattr(model, "apply"):
        from hfax.backends.jax.model import as_jax

        inputs = {name: as_jax(value) for name, value in arrays.items()}
        return model.apply(model.params, **inputs, **_no_cache(model))
    inputs = {name: torch.from_numpy(value).to(model.device) for name, value in arrays.items()}
    with torch.no_grad():
        return model.module(**inputs, **_no_cache(model))


def _name(kind: str) -> str:
    return {"encoder": "hidden states", "vision_encoder": "hidden states"}.get(kind, "logits")


def _no_cache(model: Any) -> dict[str, Any]:
    from hfax.generation.shapes import accepts

    return {"use_cache": False} if accepts(model.module, "use_cache") else {}
