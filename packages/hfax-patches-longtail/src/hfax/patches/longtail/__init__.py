"""hfax's long-tail families: one module and one plugin (entry point) per transformers family whose layers
need a fix to compile. The plugins are :mod:`hfax.patches.longtail.families`; each family's code is the
module of its name (its ``PATCHES``, and ``patch_model`` where it changes more)."""
