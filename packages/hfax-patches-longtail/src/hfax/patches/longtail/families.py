"""The long-tail families, one :class:`~hfax.patches.longtail.family.LongTailFamily` each: the objects the
distribution's entry points name (``prophetnet = "hfax.patches.longtail.families:prophetnet"``). A family's
code is the module of its name, imported when a model of the family is patched."""

from __future__ import annotations

from hfax.patches.longtail.family import LongTailFamily

bart = LongTailFamily("bart", ("bart", "mbart", "plbart", "bigbird_pegasus"))
bert = LongTailFamily("bert", ("bert",))
cpmant = LongTailFamily("cpmant", ("cpmant",))
dbrx = LongTailFamily("dbrx", ("dbrx",))
fsmt = LongTailFamily("fsmt", ("fsmt",))
git = LongTailFamily("git", ("git",))
gpt_neo = LongTailFamily("gpt_neo", ("gpt_neo",))
jetmoe = LongTailFamily("jetmoe", ("jetmoe",))
kolibri1_1 = LongTailFamily("kolibri1_1", ("kolibri1_1",))
led = LongTailFamily("led", ("led",))
longcat_flash = LongTailFamily("longcat_flash", ("longcat_flash",))
longformer = LongTailFamily("longformer", ("longformer",))
mpt = LongTailFamily("mpt", ("mpt",))
mvp = LongTailFamily("mvp", ("mvp",))
ovis2 = LongTailFamily("ovis2", ("ovis2",))
prophetnet = LongTailFamily("prophetnet", ("prophetnet",))
qwen4_exp = LongTailFamily("qwen4_exp", ("qwen4_exp", "qwen4_exp_text"))
recurrent_gemma = LongTailFamily("recurrent_gemma", ("recurrent_gemma",))
reformer = LongTailFamily("reformer", ("reformer",))
roformer = LongTailFamily("roformer", ("roformer",))
switch_transformers = LongTailFamily("switch_transformers", ("switch_transformers",))
t5 = LongTailFamily("t5", ("t5", "mt5", "umt5"))
trocr = LongTailFamily("trocr", ("trocr",))
whisper = LongTailFamily("whisper", ("whisper",))
xlm = LongTailFamily("xlm", ("xlm", "flaubert"))
xlnet = LongTailFamily("xlnet", ("xlnet",))
xmod = LongTailFamily("xmod", ("xmod",))
