"""Fixtures for hfax-core's tests: a clean plugin state and fake plugin distributions made on the fly.

Test modules are imported with ``--import-mode=importlib`` and cannot import each other, so what they
share is handed out as fixtures.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

import pytest

from hfax.plugins import reset_plugins
from hfax.testing import installed_distribution

SWITCHES = ("HFAX_DISABLE_PLUGINS", "HFAX_PLUGINS", "HFAX_BLOCK_PLUGINS", "HFAX_STRICT_PLUGINS")

BROKEN_PLUGIN = "raise RuntimeError('this plugin is broken on purpose')\n"

BACKEND_PLUGIN = """
    import hfax

    class FakeBackend(hfax.Backend):
        name = "fake"

        def devices(self):
            return ["fake:0", "fake:1"]

        def build(self, model, *, params, family, plan, mesh):
            raise NotImplementedError("a backend for tests builds no model")

    @hfax.hookimpl
    def hfax_backends():
        return [hfax.BackendSpec("fake", "fake_backend:FakeBackend", "a backend for tests")]
"""


def _family_plugin(
    family: str, claim: str = "", model_types: tuple[str, ...] = ("llama",), transformers: str = ""
) -> str:
    return f"""
        import hfax

        @hfax.hookimpl
        def hfax_families():
            return [hfax.FamilySpec({family!r}, model_types={model_types!r}, transformers={transformers!r})]

        @hfax.hookimpl
        def hfax_detect_model(config):
            return {claim or repr(family)} if config.model_type in {model_types!r} else None
    """


@pytest.fixture(autouse=True)
def clean_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with no switch set and loads plugins afresh; nothing leaks into the next test."""
    for switch in SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    reset_plugins()
    yield
    reset_plugins()


@pytest.fixture
def install(tmp_path) -> Iterator[Callable[..., None]]:
    """``install(distribution, {plugin: module}, {module: source})`` makes a fake installed plugin visible."""
    with contextlib.ExitStack() as stack:

        def install(
            distribution: str,
            entry_points: Mapping[str, str],
            modules: Mapping[str, str] | None = None,
        ) -> None:
            stack.enter_context(
                installed_distribution(tmp_path / distribution, distribution, entry_points, modules)
            )

        yield install


@pytest.fixture
def family_plugin() -> Callable[..., str]:
    """``family_plugin(family, claim=..., model_types=..., transformers=...)``: source of a family plugin.

    ``claim`` is a Python expression for what ``hfax_detect_model`` returns (default: the family name).
    """
    return _family_plugin


@pytest.fixture
def broken_plugin() -> str:
    """Source of a plugin module that raises on import."""
    return BROKEN_PLUGIN


@pytest.fixture
def backend_plugin() -> str:
    """Source of a plugin providing the backend ``fake`` (module ``fake_backend``)."""
    return BACKEND_PLUGIN
