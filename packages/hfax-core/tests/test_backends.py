"""Asking for a backend, and the checks core makes before loading a model."""

from __future__ import annotations

import importlib

import pytest

import hfax
from hfax.auto import UntestedVersionWarning, check_family_version


@pytest.fixture
def fake_backend(install, backend_plugin, monkeypatch):
    """Only the fake backend is installed, even where real backends are."""
    install("hfax-fake", {"fake": "fake_backend"}, {"fake_backend": backend_plugin})
    monkeypatch.setenv("HFAX_PLUGINS", "fake")


def test_installed_backend_loads(fake_backend):
    backend = hfax.get_backend("fake")
    assert type(backend).__name__ == "FakeBackend"
    assert backend.devices() == ["fake:0", "fake:1"]


def test_unknown_backend_lists_installed_ones(fake_backend):
    with pytest.raises(ValueError, match="unknown backend 'tpu9'; installed backends: fake"):
        hfax.get_backend("tpu9")


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("jax", "pip install -r requirements/jax.txt"),
        ("torch_xla", "pip install -r requirements/torchxla.txt"),
    ],
)
def test_known_missing_backend_names_the_install_command(fake_backend, name, command):
    with pytest.raises(hfax.BackendNotInstalledError) as raised:
        hfax.get_backend(name)
    assert command in str(raised.value)
    assert "installed backends: fake" in str(raised.value)


def test_missing_backend_fails_before_loading_anything(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    # The model path does not exist: the backend error must come first, before any download or load.
    with pytest.raises(hfax.BackendNotInstalledError, match="pip install -r requirements/jax.txt"):
        hfax.AutoModelForTPU.from_pretrained("/nonexistent/model", backend="jax")
    with pytest.raises(ValueError, match="unknown backend 'nope'; installed backends: none"):
        hfax.AutoModelForCausalLM.from_pretrained("/nonexistent/model", backend="nope")


def test_make_mesh_without_jax_says_how_to_get_it():
    try:
        importlib.import_module("hfax.backends.jax")
    except ImportError:
        pass
    else:
        pytest.skip("the JAX backend is installed")
    with pytest.raises(hfax.BackendNotInstalledError, match="pip install -r requirements/jax.txt"):
        hfax.make_mesh(model=2)


class Minimal(hfax.Backend):
    """A backend that implements only what every backend must."""

    name = "minimal"

    def devices(self):
        return ["minimal:0"]

    def build(self, model, *, params, family, plan, mesh):
        return model


def test_a_backend_gets_a_default_for_every_capability_it_does_not_offer():
    backend = Minimal()
    mesh = object()
    assert backend.adopt_mesh(mesh) is mesh and backend.adopt_mesh(None) is None
    with pytest.raises(ValueError, match="backend 'minimal' takes no axis_names"):
        backend.adopt_mesh(mesh, {"model": "tp"})
    with pytest.raises(ValueError, match="backend 'minimal' builds no device mesh"):
        backend.make_mesh(model=2)
    assert backend.serves() is False
    with pytest.raises(NotImplementedError, match="the minimal backend has no continuous-batching"):
        backend.serving_engine(None, slots=2, length=64, chunk=4)


def test_devices_and_build_have_no_default():
    class Half(hfax.Backend):
        def devices(self):
            return []

    with pytest.raises(TypeError, match="build"):
        Half()


def test_a_backend_class_that_is_not_an_hfax_backend_is_refused_by_name(install, monkeypatch):
    source = "class Plain:\n    def devices(self):\n        return []\n"
    install("hfax-plain", {}, {"plain_backend": source})
    spec = hfax.BackendSpec("plain", "plain_backend:Plain")
    with pytest.raises(TypeError, match="backend 'plain' .* must subclass hfax.Backend"):
        spec.load()


def test_make_mesh_asks_the_backend(fake_backend):
    with pytest.raises(ValueError, match="backend 'fake' builds no device mesh"):
        hfax.make_mesh(backend="fake", model=2)


def test_auto_classes_are_not_instantiated_directly():
    with pytest.raises(TypeError, match="from_pretrained"):
        hfax.AutoModelForTPU()


@pytest.fixture
def family_with_range(install, family_plugin, monkeypatch):
    def make(transformers_range: str) -> None:
        source = family_plugin("ranged", transformers=transformers_range)
        install("hfax-ranged", {"ranged": "ranged_family"}, {"ranged_family": source})
        monkeypatch.setenv("HFAX_PLUGINS", "ranged")
        monkeypatch.setattr(hfax.auto, "_WARNED", set())  # each test sees its first warning

    return make


def test_family_version_in_range_is_quiet(family_with_range, recwarn):
    family_with_range(">=4")
    check_family_version("ranged")
    assert not [w for w in recwarn if issubclass(w.category, UntestedVersionWarning)]


def test_family_version_out_of_range_warns(family_with_range):
    family_with_range("<1")
    with pytest.warns(
        UntestedVersionWarning, match=r"family 'ranged' was tested with transformers<1"
    ):
        check_family_version("ranged")


def test_an_untested_version_warns_once_per_family(family_with_range, recwarn):
    family_with_range("<1")
    for _ in range(3):
        check_family_version("ranged")
    untested = [w for w in recwarn if issubclass(w.category, UntestedVersionWarning)]
    assert len(untested) == 1 and "tested with transformers<1" in str(untested[0].message)


def test_the_generic_path_declares_the_transformers_range_it_was_tested_on(monkeypatch):
    import sys

    from hfax._builtin import TESTED_TRANSFORMERS

    assert hfax.plugins.families()["generic"].transformers == TESTED_TRANSFORMERS
    monkeypatch.setattr(hfax.auto, "_WARNED", set())
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "0")
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.0.0")
    with pytest.warns(
        UntestedVersionWarning, match=f"'generic' was tested with transformers{TESTED_TRANSFORMERS}"
    ):
        check_family_version("generic")


def test_family_version_out_of_range_raises_in_strict_mode(family_with_range, monkeypatch):
    family_with_range("<1")
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(RuntimeError, match="tested with transformers<1"):
        check_family_version("ranged")


def test_family_with_invalid_range_is_an_error(family_with_range):
    family_with_range("five")
    with pytest.raises(ValueError, match="invalid transformers range 'five'"):
        check_family_version("ranged")


def test_family_without_range_or_unknown_family_is_not_checked(family_with_range, recwarn):
    family_with_range("")
    check_family_version("ranged")
    check_family_version("generic")
    assert not recwarn.list
