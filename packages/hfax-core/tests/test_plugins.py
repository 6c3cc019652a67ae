"""Plugin loading: lazy, ordered, one entry point at a time; broken plugins reported and skipped."""

from __future__ import annotations

import sys

import pytest
import transformers

import hfax
from hfax import plugins
from hfax.plugins import PluginLoadError, PluginLoadWarning
from hfax.testing import installed_distribution


def statuses(*names: str) -> dict[str, str]:
    """Plugin statuses by name; only ``names`` if given (other hfax plugins may be installed)."""
    found = {info.name: info.status for info in plugins.plugin_infos()}
    return {name: found.get(name, "absent") for name in names} if names else found


def test_core_is_always_there():
    core = plugins.plugin_infos()[0]
    assert (core.name, core.distribution, core.status) == ("hfax-core", "hfax-core", "builtin")
    assert core.version == "0.1.0"


def test_plugins_load_lazily(install, family_plugin):
    install("hfax-lazy", {"lazy": "lazy_family"}, {"lazy_family": family_plugin("lazy")})
    assert "lazy_family" not in sys.modules
    assert statuses()["lazy"] == "loaded"
    assert "lazy_family" in sys.modules


def test_plugins_load_in_a_stable_order(install, family_plugin):
    install(
        "zeta-plugins",
        {"b": "zeta_b", "a": "zeta_a"},
        {"zeta_a": family_plugin("za"), "zeta_b": family_plugin("zb")},
    )
    install("alpha-plugins", {"z": "alpha_z"}, {"alpha_z": family_plugin("az")})
    names = [info.name for info in plugins.plugin_infos() if info.name in ("a", "b", "z")]
    assert names == ["z", "a", "b"]  # by distribution, then by entry-point name


def test_plugin_info_names_what_it_provides(install, family_plugin, backend_plugin):
    install("hfax-fam", {"fam": "fam_family"}, {"fam_family": family_plugin("fam")})
    install("hfax-fake", {"fake": "fake_backend"}, {"fake_backend": backend_plugin})
    infos = {info.name: info for info in plugins.plugin_infos()}
    assert (infos["fam"].distribution, infos["fam"].version, infos["fam"].families) == (
        "hfax-fam",
        "0.0.0",
        ("fam",),
    )
    assert infos["fake"].backends == ("fake",)
    assert "fake" in plugins.backends() and "fam" in plugins.families()


def test_broken_plugin_is_skipped_with_a_warning(
    install, broken_plugin, family_plugin, monkeypatch
):
    install("hfax-broken", {"broken": "broken_plugin"}, {"broken_plugin": broken_plugin})
    install("hfax-good", {"good": "good_family"}, {"good_family": family_plugin("good")})
    monkeypatch.setenv(
        "HFAX_PLUGINS", "broken,good"
    )  # leave out any real family plugin installed beside core
    with pytest.warns(PluginLoadWarning) as caught:
        infos = {info.name: info for info in plugins.plugin_infos()}
    [warning] = caught
    message = str(warning.message)
    assert "hfax-broken" in message  # the distribution
    assert "RuntimeError: this plugin is broken on purpose" in message  # the error
    assert "HFAX_BLOCK_PLUGINS=hfax-broken:broken" in message  # how to disable it
    assert infos["broken"].status == "failed" and "broken on purpose" in infos["broken"].error
    # ... and the rest keeps working.
    assert infos["good"].status == "loaded"
    assert hfax.detect_family(transformers.LlamaConfig()) == "good"


def test_strict_mode_raises(install, broken_plugin, monkeypatch):
    install("hfax-broken", {"broken": "broken_plugin"}, {"broken_plugin": broken_plugin})
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="'broken' from distribution 'hfax-broken'") as raised:
        plugins.get_plugin_manager()
    assert isinstance(raised.value.__cause__, RuntimeError)
    # A failed strict load leaves nothing half-loaded: the next use tries again.
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "broken")
    plugins.reset_plugins()
    assert statuses()["broken"] == "blocked"


def test_plugin_whose_hook_raises_is_unregistered(install, monkeypatch):
    source = """
        import hfax

        @hfax.hookimpl
        def hfax_backends():
            raise KeyError("no")

        @hfax.hookimpl
        def hfax_detect_model(config):
            return "halfway"
    """
    install("hfax-halfway", {"halfway": "halfway_plugin"}, {"halfway_plugin": source})
    monkeypatch.setenv("HFAX_PLUGINS", "halfway")
    with pytest.warns(PluginLoadWarning, match="KeyError"):
        assert statuses()["halfway"] == "failed"
    assert hfax.detect_family(transformers.LlamaConfig()) == "generic"


def test_plugins_are_identified_by_distribution_and_name(install, family_plugin, monkeypatch):
    # A third party naming its entry point like another distribution's does not displace it.
    install("hfax-first", {"dup": "first_family"}, {"first_family": family_plugin("first")})
    install("aaa-second", {"dup": "second_family"}, {"second_family": family_plugin("second")})
    monkeypatch.setenv("HFAX_PLUGINS", "dup")
    infos = plugins.plugin_infos()
    assert [(info.id, info.status) for info in infos if info.name == "dup"] == [
        ("aaa-second:dup", "loaded"),
        ("hfax-first:dup", "loaded"),
    ]
    assert {"first", "second"} <= set(plugins.families())
    # Blocking says which: distribution:name blocks one, a bare name every distribution's.
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "aaa-second:dup")
    plugins.reset_plugins()
    assert [(info.id, info.status) for info in plugins.plugin_infos() if info.name == "dup"] == [
        ("aaa-second:dup", "blocked"),
        ("hfax-first:dup", "loaded"),
    ]
    assert "second" not in plugins.families()
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "dup")
    plugins.reset_plugins()
    assert {info.status for info in plugins.plugin_infos() if info.name == "dup"} == {"blocked"}


RAISING_HOOKS = """
    import hfax

    @hfax.hookimpl
    def hfax_detect_model(config):
        raise KeyError("detect failed on purpose")

    @hfax.hookimpl
    def hfax_patch_model(model, family, backend, patcher):
        patcher.setattr(model.config, "halfway", True)
        raise KeyError("patch failed on purpose")
"""


def test_a_hook_that_raises_at_run_time_is_named_and_skipped(install, family_plugin, monkeypatch):
    install("hfax-raising", {"raising": "raising_hooks"}, {"raising_hooks": RAISING_HOOKS})
    install("hfax-good", {"good": "good_family"}, {"good_family": family_plugin("good")})
    monkeypatch.setenv("HFAX_PLUGINS", "raising,good")
    config = transformers.LlamaConfig()
    with pytest.warns(plugins.PluginHookWarning) as caught:
        assert hfax.detect_family(config) == "good"
    (warning,) = caught
    assert "'hfax-raising:raising': hfax_detect_model raised KeyError" in str(warning.message)
    assert "HFAX_BLOCK_PLUGINS=hfax-raising:raising" in str(warning.message)

    class Model:
        pass

    model = Model()
    model.config = transformers.LlamaConfig()
    hook = plugins.get_plugin_manager().hook
    with pytest.warns(plugins.PluginHookWarning, match="hfax_patch_model raised KeyError"):
        hook.hfax_patch_model(
            model=model, family="good", backend="jax", patcher=hfax.Patcher(model)
        )
    assert not hasattr(model.config, "halfway")  # what it patched before failing is undone

    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(plugins.PluginHookError, match="detect failed on purpose") as raised:
        hfax.detect_family(config)
    assert isinstance(raised.value.__cause__, KeyError)


WRONG_TYPES = """
    import hfax

    @hfax.hookimpl
    def hfax_sharding_plan(model, config, family):
        return "column-parallel everything"

    @hfax.hookimpl
    def hfax_detect_model(config):
        return 42
"""


def test_a_hook_returning_the_wrong_type_is_named(install, monkeypatch):
    install("hfax-wrong", {"wrong": "wrong_types"}, {"wrong_types": WRONG_TYPES})
    monkeypatch.setenv("HFAX_PLUGINS", "wrong")
    config = transformers.LlamaConfig()
    hook = plugins.get_plugin_manager().hook
    with pytest.warns(plugins.PluginHookWarning, match="hfax_sharding_plan returned str"):
        plan = hook.hfax_sharding_plan(model=object(), config=config, family="generic")
    assert isinstance(plan, hfax.ShardingPlan)  # core's default plan instead
    with pytest.warns(plugins.PluginHookWarning, match="'hfax-wrong:wrong': hfax_detect_model"):
        assert hfax.detect_family(config) == "generic"
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(plugins.PluginHookError, match="hfax_sharding_plan returned str"):
        hook.hfax_sharding_plan(model=object(), config=config, family="generic")


def test_disable_plugins(install, family_plugin, monkeypatch):
    install("hfax-fam", {"fam": "fam_family"}, {"fam_family": family_plugin("fam")})
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    assert statuses("hfax-core", "fam") == {"hfax-core": "builtin", "fam": "blocked"}
    assert "fam_family" not in sys.modules
    assert hfax.detect_family(transformers.LlamaConfig()) == "generic"


def test_load_only_some_plugins(install, family_plugin, broken_plugin, monkeypatch):
    install("hfax-broken", {"broken": "broken_plugin"}, {"broken_plugin": broken_plugin})
    sources = {
        "fam_family": family_plugin("fam"),
        "other_family": family_plugin("other", model_types=("gpt2",)),
    }
    install("hfax-fam", {"fam": "fam_family", "other": "other_family"}, sources)
    monkeypatch.setenv("HFAX_PLUGINS", "fam, other")
    assert statuses("broken", "fam", "other") == {
        "broken": "blocked",
        "fam": "loaded",
        "other": "loaded",
    }
    assert "broken_plugin" not in sys.modules


def test_block_some_plugins(install, family_plugin, broken_plugin, monkeypatch):
    install("hfax-broken", {"broken": "broken_plugin"}, {"broken_plugin": broken_plugin})
    install("hfax-fam", {"fam": "fam_family"}, {"fam_family": family_plugin("fam")})
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "broken")
    monkeypatch.setenv(
        "HFAX_STRICT_PLUGINS", "1"
    )  # a blocked plugin is never imported, so strict mode is content
    assert statuses("broken", "fam") == {"broken": "blocked", "fam": "loaded"}


def test_register_and_unregister_in_code(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")  # code-registered plugins still count

    class Plugin:
        @hfax.hookimpl
        def hfax_detect_model(self, config):
            return "incode"

        @hfax.hookimpl
        def hfax_families(self):
            return [hfax.FamilySpec("incode")]

    hfax.register(Plugin(), name="incode")
    info = plugins.plugin_infos()[-1]
    assert (info.name, info.distribution, info.families) == (
        "incode",
        "(registered in code)",
        ("incode",),
    )
    assert hfax.detect_family(transformers.LlamaConfig()) == "incode"
    hfax.unregister("incode")
    assert statuses("incode") == {"incode": "absent"}
    assert hfax.detect_family(transformers.LlamaConfig()) == "generic"


def test_installed_distribution_is_gone_after_its_block(tmp_path, family_plugin):
    with installed_distribution(
        tmp_path / "d", "hfax-temp", {"temp": "temp_family"}, {"temp_family": family_plugin("temp")}
    ):
        assert statuses("temp") == {"temp": "loaded"}
    assert statuses("temp") == {"temp": "absent"}
    assert "temp_family" not in sys.modules
