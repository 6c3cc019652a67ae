"""hfax's Gemma family: Gemma, Gemma 2 and Gemma 3 (text). The hooks are in :mod:`hfax.patches.gemma.plugin`."""
