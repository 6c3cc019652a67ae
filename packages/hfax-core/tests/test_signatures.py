"""hfax.signatures finds a forward's cache by what it is, however a release spells it (no torch needed:
stand-in classes carry transformers' module names; tests/test_signatures_transformers.py checks the real
ones)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from hfax import signatures


class Cache:  # transformers' base class, as hfax sees it: a class named Cache in transformers.cache_utils
    pass


Cache.__module__ = "transformers.cache_utils"


class EncoderDecoderCache(Cache):
    pass


class ModelsOwnCache(Cache):
    pass


ModelsOwnCache.__module__ = "transformers.models.some_model.modeling_some_model"


class NotACache:
    pass


@pytest.mark.parametrize(
    "annotation, named",
    [
        (Cache, True),
        (Cache | None, True),
        (Optional[EncoderDecoderCache], True),
        (ModelsOwnCache | None, True),
        ("Cache | None", True),
        (list[int] | None, False),
        (NotACache | None, False),
        (int, False),
    ],
)
def test_an_annotation_names_a_cache_by_its_class(annotation, named):
    assert signatures.names_a_cache(annotation) is named


def test_the_cache_parameter_is_found_by_its_type_whatever_its_name(monkeypatch):
    monkeypatch.setattr(signatures, "release_cache_name", lambda: "cache")

    def v523(self, input_ids=None, past_key_values: Cache | None = None, use_cache=None): ...
    def v524(self, input_ids=None, cache: Cache | None = None, use_cache=None): ...
    def mamba_523(self, input_ids=None, cache_params: ModelsOwnCache | None = None): ...
    def renamed_again(self, input_ids=None, kv_store: EncoderDecoderCache | None = None): ...

    assert [signatures.cache_parameter(f) for f in (v523, v524, mamba_523, renamed_again)] == [
        "past_key_values",
        "cache",
        "cache_params",
        "kv_store",
    ]


def test_a_cache_annotated_otherwise_is_read_by_the_releases_own_name(monkeypatch):
    # BERT-style decoders annotate their cache as tuples of tensors; the installed transformers names its
    # cache (in GenerationMixin.prepare_inputs_for_generation) as they do.
    def bert_decoder(self, input_ids=None, cache: tuple[tuple[int]] | None = None): ...
    def rwkv(self, input_ids=None, state: list[int] | None = None): ...

    monkeypatch.setattr(signatures, "release_cache_name", lambda: "cache")
    assert signatures.cache_parameter(bert_decoder) == "cache"
    assert signatures.cache_parameter(rwkv) == ""
    monkeypatch.setattr(signatures, "release_cache_name", lambda: "past_key_values")
    assert signatures.cache_parameter(bert_decoder) == ""


def test_an_output_classes_cache_field_and_value_are_found_by_type():
    @dataclasses.dataclass
    class Output:
        logits: list | None = None
        cache: EncoderDecoderCache | None = None

        def values(self):
            values = (getattr(self, field.name) for field in dataclasses.fields(self))
            return [value for value in values if value is not None]

    held = EncoderDecoderCache()
    assert signatures.cache_field(Output) == "cache"
    assert signatures.output_cache(Output(logits=[1], cache=held)) is held
    assert signatures.output_cache(Output(logits=[1])) is None
