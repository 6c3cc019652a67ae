"""hfax's long-tail families: one module and one plugin (entry point) per transformers family whose layers
need a static-shape fix to compile; each module's ``plugin`` is a
:class:`~hfax.patches.longtail.family.LongTailFamily`."""
