"""hfax's long-tail families: one module and one plugin (entry point) per transformers family whose layers
need a fix to compile, or whose ``generate`` needs what only the family knows. The plugins are
:mod:`hfax.patches.longtail.families`; each family's code is the module of its name (its ``PATCHES``,
``patch_model`` where it changes more, ``generation_traits`` for ``generate``)."""
