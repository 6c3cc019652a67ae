"""``hfax finetune`` end to end on a tiny Llama with a character tokenizer: the held-out loss falls, the
adapter loads in PEFT, and bad input is refused with the file's line number or the argument's name."""

import json

import peft
import pytest
import torch
import transformers
from typer.testing import CliRunner

from hfax.cli import app


def character_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per printable ASCII character (ids 4-98), after <pad> <s> </s> <unk>: fits vocabulary 128."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + [chr(c) for c in range(32, 127)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


@pytest.fixture(scope="module")
def checkpoint(tiny):
    directory, _, _ = tiny("llama")
    character_tokenizer().save_pretrained(directory)
    return directory


def write_records(path, records) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_finetune_lowers_held_out_loss_and_saves_a_peft_adapter(checkpoint, tmp_path):
    data = tmp_path / "data.jsonl"
    write_records(
        data, [{"text": "abcabcabcabc" * 2}] * 16 + [{"prompt": "1+1=", "completion": "2"}] * 4
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "finetune",
            "-m",
            str(checkpoint),
            "--data",
            str(data),
            "--out",
            str(out),
            "--steps",
            "12",
            "--lora-rank",
            "4",
            "--batch-size",
            "4",
            "--lr",
            "3e-2",
            "--max-length",
            "32",
        ],
    )
    assert result.exit_code == 0, result.output
    log = json.loads((out / "train_log.json").read_text())
    assert log["eval_loss_after"] < log["eval_loss_before"] - 0.5, log
    assert len(log["losses"]) == 12 and (out / "loss.svg").read_text().startswith("<svg")
    assert "held-out loss" in result.output

    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(checkpoint), out
    )
    ids = character_tokenizer()("abcabc", return_tensors="pt")
    with torch.no_grad():
        loss = model(**ids, labels=ids["input_ids"]).loss.item()
    assert loss < log["eval_loss_before"] - 0.5, "PEFT must load the trained adapter"


@pytest.mark.parametrize(
    ("lines", "options", "message"),
    [
        ('{"text": "ab"}\n{"text": 3}\n', [], "data.jsonl:2: expected"),
        ('{"text": "ab"}\nnot json\n', [], "data.jsonl:2: not valid JSON"),
        ('{"text": "ab"}\n', ["--lora-rank", "0"], "rank must be a positive integer"),
        ('{"text": "ab"}\n', ["--lora-targets", "nothing"], "match no linear layer"),
    ],
)
def test_bad_input_is_refused(checkpoint, tmp_path, lines, options, message):
    data = tmp_path / "data.jsonl"
    data.write_text(lines)
    result = CliRunner().invoke(
        app,
        [
            "finetune",
            "-m",
            str(checkpoint),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o"),
            *options,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
