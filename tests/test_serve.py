"""``hfax serve`` as a subprocess on 127.0.0.1, driven by the official ``openai`` client.

One server (a tiny saved Llama, 8 rows) serves the whole module. Its answers are checked against
transformers' own ``generate`` (greedy) and hfax's ``model.generate`` (seeded sampling, which draws the
same noise per seed, step and row).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

SLOTS, QUEUE, LENGTH = 8, 16, 256
PROMPTS = [
    "the capital of france is",
    "a small cat and a big dog",
    "one two three four five six seven eight nine",
    "water",
    "the old man and the sea were here at night",
    "red blue green",
    "why is the sun hot",
    "i can see the river from my house",
]


#: A chat template that names the tools and writes earlier calls as Qwen 2's does, in short markers (every
#: byte is a token here), and the response template that reads its model's answers, as transformers' for
#: Qwen 2 reads Qwen's: what the byte-level server's tools are tested with.
TOOL_TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "assistant: ",
    "fields": {
        "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"content": "text"},
    },
}  # fmt: skip


#: What the tools' server's model is taught to answer (:func:`_taught`).
ASKED = [{"role": "user", "content": "weather?"}]
ANSWER = 'Let me see.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


class Served:
    """A tiny Llama served in a subprocess: on the word-level tokenizer of hfax.testing, or with
    ``byte_level`` on its byte-level one (which llguidance reads: ``response_format``'s tests)."""

    def __init__(
        self,
        tmp_path,
        byte_level: bool = False,
        slots: int = SLOTS,
        options: tuple[str, ...] = (),
        lesson: tuple[list[int], str] | None = None,
    ) -> None:
        import transformers

        from hfax.testing import (
            TINY_SPECIAL,
            save_tiny,
            save_tiny_byte_tokenizer,
            save_tiny_tokenizer,
        )

        self.path = str(tmp_path / "tiny-llama")
        save_tokenizer = save_tiny_byte_tokenizer if byte_level else save_tiny_tokenizer
        self.tokenizer = save_tokenizer(self.path)
        if lesson is not None:  # a chat template that shows tools, and how its model writes calls
            self.tokenizer.chat_template = TOOL_TEMPLATE
            self.tokenizer.response_template = RESPONSE_TEMPLATE
            self.tokenizer.save_pretrained(self.path)
        config = transformers.LlamaConfig(
            vocab_size=len(self.tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=LENGTH, **TINY_SPECIAL,
        )  # fmt: skip
        self.reference = save_tiny(config, self.path)
        if lesson is not None:
            answer = self.tokenizer(lesson[1], add_special_tokens=False)["input_ids"]
            self.reference = _taught(self.reference, self.path, lesson[0], answer)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "serve.log", "w+")
        command = [sys.executable, "-c", "from hfax.cli import main; main()", "serve", "-m", self.path,
                   "--port", str(self.port), "--max-batch", str(slots), "--max-queue", str(QUEUE),
                   "--drain", "20", "--prefix-cache", "4", *options]  # fmt: skip
        env = {**os.environ, "HFAX_CACHE": str(tmp_path / "hfax-cache")}  # not the user's cache
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)
        self._jax_model = None

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"hfax serve exited {self.process.returncode}:\n{self.logs()}")
            try:
                if _get(f"{self.url}/health") == "ok":
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"hfax serve did not become healthy:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def metrics(self) -> dict[str, float]:
        lines = _get(f"{self.url}/metrics").splitlines()
        return {
            line.split()[0]: float(line.split()[1]) for line in lines if not line.startswith("#")
        }

    def ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )

    def greedy(self, ids: list[int], max_new: int) -> list[int]:
        """transformers' own greedy continuation, EOS excluded."""
        from hfax.testing import reference_generate

        out = reference_generate(self.reference, np.array([ids]), max_new_tokens=max_new)[0]
        return _until_eos(out[len(ids) :].tolist())

    @property
    def jax_model(self):
        if self._jax_model is None:
            from hfax import AutoModelForCausalLM

            self._jax_model = AutoModelForCausalLM.from_pretrained(self.path, backend="jax")
        return self._jax_model

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def complete(self, prompt, **options):
        options.setdefault("temperature", 0)
        return self.client.completions.create(model=self.path, prompt=prompt, **options)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _until_eos(tokens: list[int], eos: int = 2) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(tmp_path_factory.mktemp("serve"))
    yield server
    server.stop()
    server.log.close()


def _taught(model, path: str, prompt: list[int], answer: list[int]) -> object:
    """``model`` trained until its greedy continuation of ``prompt`` is ``answer``'s tokens and EOS, saved
    to ``path`` and loaded back: a model that calls a tool by itself, in its template's markup."""
    import torch

    ids = torch.tensor([prompt + answer + [2]])  # then EOS
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(path)
    return type(model).from_pretrained(path).eval()


@pytest.fixture(scope="module")
def tool_served(tmp_path_factory):
    """The byte-level server's tiny Llama with :data:`TOOL_TEMPLATE`, taught to answer "weather?" with
    :data:`ANSWER`, a call of the weather tool (4 rows)."""
    from hfax.testing import save_tiny_byte_tokenizer

    tokenizer = save_tiny_byte_tokenizer(tmp_path_factory.mktemp("tool-tokenizer"))
    tokenizer.chat_template = TOOL_TEMPLATE
    prompt = list(tokenizer.apply_chat_template(
        ASKED, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"])  # fmt: skip
    server = Served(tmp_path_factory.mktemp("serve-tools"), byte_level=True, slots=4,
                    lesson=(prompt, ANSWER))  # fmt: skip
    yield server
    server.stop()
    server.log.close()


@pytest.fixture(scope="module")
def json_served(tmp_path_factory):
    """A server of a tiny Llama on the byte-level tokenizer, whose tokens spell JSON (4 rows)."""
    server = Served(tmp_path_factory.mktemp("serve-json"), byte_level=True, slots=4)
    yield server
    server.stop()
    server.log.close()


def _streamed_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join(
        (c.choices[0].text if hasattr(c.choices[0], "text") else c.choices[0].delta.content or "")
        for c in chunks
        if c.choices
    )
    return text, chunks


def test_models_health_and_metrics(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [served.path]
    assert _get(f"{served.url}/health") == "ok"
    metrics = served.metrics()
    assert metrics["hfax_batch_slots"] == SLOTS
    assert metrics["hfax_compiles_total"] >= 1
    share = metrics["hfax_host_share"]  # NaN before two reads of one stream's chunks measure it
    assert math.isnan(share) or 0 <= share <= 1


def test_completion_greedy_equals_transformers(served):
    prompt = PROMPTS[0]
    expected = served.greedy(served.ids(prompt), 12)
    answer = served.complete(prompt, max_tokens=12)
    choice = answer.choices[0]
    assert choice.text == served.text(expected)
    assert choice.finish_reason == ("length" if len(expected) == 12 else "stop")
    assert answer.usage.prompt_tokens == len(served.ids(prompt))
    assert answer.usage.completion_tokens == len(expected)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + len(expected)
    text, chunks = _streamed_text(served.complete(prompt, max_tokens=12, stream=True))
    assert text == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected)  # usage without include_usage too


def test_completion_token_ids_and_logprobs(served):
    """A prompt of token ids; logprobs are transformers' log-softmax at each greedy token."""
    import torch

    ids = served.ids(PROMPTS[1])
    answer = served.complete(ids, max_tokens=6, logprobs=3)
    expected = served.greedy(ids, 6)
    logprobs = answer.choices[0].logprobs
    assert logprobs.tokens == [served.tokenizer.decode([t]) for t in expected]
    with torch.no_grad():
        logits = served.reference(torch.tensor([ids + expected])).logits[0, len(ids) - 1 : -1]
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(expected)), expected].numpy()
    np.testing.assert_allclose(logprobs.token_logprobs, want, atol=1e-4)
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    # the greedy token is the likeliest, so it heads its alternatives
    assert [next(iter(top)) for top in logprobs.top_logprobs] == logprobs.tokens


def test_echo_gives_the_prompts_log_probabilities_as_transformers_computes_them(served):
    """``echo`` with ``logprobs`` (how lm-evaluation-harness scores a text): the prompt's text and each of
    its tokens' log-probabilities after the ones before it (none for the first), transformers'
    log-softmax within 1e-4, then the completion's; ``max_tokens: 0`` gives the prompt alone."""
    import torch

    prompt = PROMPTS[4]
    ids = served.ids(prompt)
    with torch.no_grad():
        logits = served.reference(torch.tensor([ids])).logits[0, :-1].float()
    expected = torch.log_softmax(logits, -1)
    want = expected[torch.arange(len(ids) - 1), ids[1:]].numpy()
    alone = served.complete(prompt, max_tokens=0, echo=True, logprobs=2)
    choice = alone.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert alone.usage.completion_tokens == 0 and alone.usage.prompt_tokens == len(ids)
    logprobs = choice.logprobs
    assert logprobs.tokens == [served.tokenizer.decode([t]) for t in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    np.testing.assert_allclose(logprobs.token_logprobs[1:], want, atol=1e-4)
    for position, top in enumerate(logprobs.top_logprobs[1:]):
        best = torch.topk(expected[position], 2)
        assert list(top) == [served.tokenizer.decode([t]) for t in best.indices.tolist()]
        np.testing.assert_allclose(list(top.values()), best.values.numpy(), atol=1e-4)
    greedy = served.greedy(ids, 3)
    choice = served.complete(prompt, max_tokens=3, echo=True, logprobs=1).choices[0]
    assert choice.text == prompt + served.text(greedy)
    assert len(choice.logprobs.token_logprobs) == len(ids) + len(greedy)
    np.testing.assert_allclose(choice.logprobs.token_logprobs[1 : len(ids)], want, atol=1e-4)
    assert served.complete(prompt, max_tokens=3, echo=True).choices[0].text == choice.text
    for tokens, whole in ((0, alone.choices[0]), (3, choice)):  # streamed: the same text and scores
        chunks = list(
            served.complete(prompt, max_tokens=tokens, echo=True, logprobs=1 if tokens else 2,
                            stream=True)
        )  # fmt: skip
        assert "".join(c.choices[0].text for c in chunks) == whole.text
        assert chunks[0].choices[0].text == prompt  # the prompt first, alone
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason
        streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        for name in ("tokens", "token_logprobs", "text_offset"):
            assert [x for part in streamed for x in getattr(part, name)] == getattr(
                whole.logprobs, name
            ), name


def test_chat_equals_transformers_streamed_and_not(served):
    messages = [
        {"role": "system", "content": "you are a cat"},
        {"role": "user", "content": "hello"},
    ]
    expected = served.text(served.greedy(served.chat_ids(messages), 10))
    answer = served.client.chat.completions.create(
        model=served.path, messages=messages, max_tokens=10, temperature=0
    )
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == expected
    assert answer.usage.prompt_tokens == len(served.chat_ids(messages))
    stream = served.client.chat.completions.create(
        model=served.path, messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, chunks = _streamed_text(stream)
    assert text == expected
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == answer.usage.total_tokens


def test_seeded_sampling_equals_generate_and_repeats(served):
    """Choice i of a seeded request draws what hfax's generate draws for row i of n copies of the prompt
    with the same seed (top_k=0: OpenAI has no top-k)."""
    ids = served.ids(PROMPTS[2])
    options = dict(max_tokens=10, temperature=0.8, top_p=0.9, seed=1234, n=2)
    answer = served.complete(PROMPTS[2], **options)
    again = served.complete(PROMPTS[2], **options)
    assert [c.text for c in answer.choices] == [c.text for c in again.choices]
    out = served.jax_model.generate(
        np.array([ids, ids]), max_new_tokens=10, do_sample=True, temperature=0.8, top_p=0.9,
        top_k=0, seed=1234,
    )  # fmt: skip
    expected = [served.text(_until_eos(row[len(ids) :].tolist())) for row in np.asarray(out)]
    assert [c.text for c in answer.choices] == expected
    assert expected[0] != expected[1]
    other = served.complete(PROMPTS[2], **{**options, "seed": 99})
    assert [c.text for c in other.choices] != expected


def test_several_prompts_in_one_request_answer_as_each_alone(served):
    """A completions request of several prompts (text and token ids): ``n`` choices per prompt, numbered
    prompt by prompt, each prompt's choices those of a request of it alone (greedy: transformers'
    tokens; seeded: the same draws), usage summed over the prompts, ``echo`` per prompt."""
    prompts = [PROMPTS[0], served.ids(PROMPTS[5]), PROMPTS[3]]
    answer = served.complete(prompts, max_tokens=5)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    for choice, prompt in zip(answer.choices, prompts):
        ids = served.ids(prompt) if isinstance(prompt, str) else prompt
        assert choice.text == served.text(served.greedy(ids, 5))
    assert answer.usage.prompt_tokens == sum(
        len(served.ids(p) if isinstance(p, str) else p) for p in prompts
    )
    options = dict(max_tokens=6, temperature=0.9, seed=7, n=2)
    sampled = served.complete(prompts[:2], **options)
    alone = [served.complete(prompt, **options) for prompt in prompts[:2]]
    assert [c.text for c in sampled.choices] == [c.text for a in alone for c in a.choices]
    assert [c.index for c in sampled.choices] == [0, 1, 2, 3]
    echoed = served.complete(prompts, max_tokens=0, echo=True, logprobs=0)
    token_ids_text = served.tokenizer.decode(prompts[1])  # token ids echo as decoded, BOS and all
    assert [c.text for c in echoed.choices] == [PROMPTS[0], token_ids_text, PROMPTS[3]]
    for choice, prompt in zip(echoed.choices, prompts):
        single = served.complete(prompt, max_tokens=0, echo=True, logprobs=0).choices[0]
        assert choice.logprobs.token_logprobs == single.logprobs.token_logprobs


def _post(served, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{served.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_tokenizer_endpoints_give_the_served_tokenizers_answers(served):
    """vLLM's /tokenize, /detokenize and /tokenizer_info (lm-evaluation-harness's remote tokenizer calls
    them), answered by the served tokenizer as transformers gives them."""
    tokenizer, prompt = served.tokenizer, PROMPTS[6]
    status, body = _post(served, "/tokenize", {"model": served.path, "prompt": prompt})
    assert status == 200 and body["tokens"] == tokenizer(prompt)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == LENGTH
    plain = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert plain != body["tokens"]  # the tiny tokenizer adds BOS
    status, body = _post(served, "/tokenize", {"prompt": prompt, "add_special_tokens": False})
    assert body["tokens"] == plain
    messages = [{"role": "user", "content": "hello"}]
    status, body = _post(served, "/tokenize", {"messages": messages})
    assert body["tokens"] == served.chat_ids(messages)
    status, body = _post(served, "/detokenize", {"tokens": plain})
    assert status == 200 and body["prompt"] == tokenizer.decode(plain)
    info = json.loads(_get(f"{served.url}/tokenizer_info"))
    assert info["eos_token"] == tokenizer.eos_token and info["bos_token"] == tokenizer.bos_token
    assert info["chat_template"] == tokenizer.chat_template and info["model_max_length"] == LENGTH
    for path, bad, param in [
        ("/tokenize", {"prompt": prompt, "messages": messages}, "prompt"),
        ("/tokenize", {"prompt": prompt, "add_special_tokens": "no"}, "add_special_tokens"),
        ("/tokenize", {"prompt": prompt, "model": "gpt-4"}, "model"),
        ("/detokenize", {"tokens": [len(tokenizer)]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [1], "skip": True}, "skip"),
    ]:
        status, body = _post(served, path, bad)
        assert status in (400, 404) and body["error"]["param"] == param, (path, bad, body)


def _adjusted_greedy(served, ids, max_new, presence=0.0, frequency=0.0, bias=None):
    """OpenAI's definition on transformers' logits: each step's logits plus ``bias``, minus
    ``count * frequency + (count > 0) * presence`` for the tokens generated so far; the argmax, until EOS.
    Returns the tokens and each one's log-probability under the model's own distribution."""
    import torch

    tokens, logprobs = [], []
    counts = torch.zeros(served.reference.config.vocab_size)
    with torch.no_grad():
        for _ in range(max_new):
            logits = served.reference(torch.tensor([ids + tokens])).logits[0, -1].float()
            adjusted = logits - counts * frequency - (counts > 0).float() * presence
            for token, value in (bias or {}).items():
                adjusted[int(token)] += value
            token = int(torch.argmax(adjusted))
            if token == 2:  # EOS
                break
            tokens.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            counts[token] += 1
    return tokens, logprobs


def test_penalties_and_logit_bias_follow_openais_definition(served):
    """presence_penalty, frequency_penalty and logit_bias adjust the logits each greedy step as OpenAI
    defines them (computed here on transformers' logits); logprobs stay the model's own (as vLLM's); a
    request without them decoding beside one with them gets its plain greedy tokens."""
    prompt = PROMPTS[7]
    ids = served.ids(prompt)
    plain = served.greedy(ids, 16)
    bias = {str(plain[0]): -100.0, "7": 4.0}
    settings = dict(presence_penalty=0.8, frequency_penalty=1.5, logit_bias=bias)
    expected, logprobs = _adjusted_greedy(
        served, ids, 16, 0.8, 1.5, {int(k): v for k, v in bias.items()}
    )
    assert expected != plain  # the adjustments change the tokens
    results = {}

    def ask(name, **options):
        results[name] = served.complete(prompt, max_tokens=16, logprobs=0, **options).choices[0]

    threads = [threading.Thread(target=ask, args=("adjusted",), kwargs=settings),
               threading.Thread(target=ask, args=("plain",))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["adjusted"].text == served.text(expected)
    np.testing.assert_allclose(results["adjusted"].logprobs.token_logprobs, logprobs, atol=1e-4)
    assert results["plain"].text == served.text(plain)
    forced = served.complete(prompt, max_tokens=5, logit_bias={"9": 100}).choices[0]
    assert forced.text == served.text([9] * 5)
    chat = served.client.chat.completions.create(
        model=served.path, messages=[{"role": "user", "content": prompt}], max_tokens=6,
        temperature=0, frequency_penalty=2.0,
    )  # fmt: skip
    messages = [{"role": "user", "content": prompt}]
    want, _ = _adjusted_greedy(served, served.chat_ids(messages), 6, frequency=2.0)
    assert chat.choices[0].message.content == served.text(want)


#: A schema whose documents are short (every string and array bounded, no other keys), so that even a
#: random model's output completes within ``max_tokens``: what ``response_format`` is tested with.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "color", "tags"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
}


def _follows_schema(text: str) -> None:
    """``text`` parses as JSON and :data:`SCHEMA` validates it (checked by hand: jsonschema is not
    installed in the test sessions)."""
    value = json.loads(text)
    assert isinstance(value, dict) and set(value) == set(SCHEMA["required"]), text
    assert isinstance(value["name"], str) and len(value["name"]) <= 8, text
    assert type(value["age"]) is int and 0 <= value["age"] <= 150, text
    assert isinstance(value["ok"], bool), text
    assert value["color"] in ("red", "green", "blue"), text
    tags = value["tags"]
    assert isinstance(tags, list) and len(tags) <= 2, text
    assert all(isinstance(tag, str) and len(tag) <= 3 for tag in tags), text


def _constrained_greedy(served, ids: list[int], schema: dict, max_new: int) -> list[int]:
    """The greedy tokens under ``schema``, computed here: llguidance's mask of each step on
    transformers' logits, the argmax, until the grammar is complete or allows only EOS."""
    import llguidance.hf
    import torch
    from llguidance import LLMatcher
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    tokenizer = llguidance.hf.from_tokenizer(served.tokenizer, n_vocab=len(served.tokenizer))
    grammar = LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    matcher = LLMatcher(tokenizer, grammar)
    bitmask = allocate_token_bitmask(1, len(served.tokenizer))
    tokens: list[int] = []
    with torch.no_grad():
        while len(tokens) < max_new and not matcher.is_stopped():
            logits = served.reference(torch.tensor([ids + tokens])).logits[0, -1].float()
            fill_next_token_bitmask(matcher, bitmask)
            bits = (bitmask[0, np.arange(len(logits)) // 32] >> (np.arange(len(logits)) % 32)) & 1
            logits[torch.from_numpy(bits == 0)] = -torch.inf
            token = int(torch.argmax(logits))
            if token == 2:  # EOS
                break
            tokens.append(token)
            assert matcher.consume_token(token)
    return tokens


def test_response_format_holds_every_choice_to_its_grammar(json_served):
    """json_schema and json_object outputs, greedy and sampled, completions and chat, streamed and not,
    decoded at once beside a request without a grammar: each constrained choice ends with "stop" on a
    document that parses (and that the schema validates); the greedy schema choice is the argmax of each
    step's masked logits (computed on transformers' logits with llguidance); the plain request gets its
    own greedy tokens, as alone."""
    served = json_served
    # Any JSON object may be long, and a random model's strings run on; these seeds end theirs.
    prompt, plain_prompt = "the capital of france is", "one two three four"
    schema_greedy = served.text(_constrained_greedy(served, served.ids(prompt), SCHEMA, 120))
    plain = served.text(served.greedy(served.ids(plain_prompt), 40))
    messages = [{"role": "user", "content": "give me json"}]
    results: dict = {}
    asks = {
        "schema greedy": lambda: served.complete(
            prompt, max_tokens=120, extra_body={"response_format": JSON_SCHEMA}
        ),
        "schema sampled": lambda: served.complete(
            prompt, max_tokens=120, temperature=1.0, seed=5, n=2,
            extra_body={"response_format": JSON_SCHEMA},
        ),
        "object greedy": lambda: served.complete(
            "a small cat", max_tokens=120, extra_body={"response_format": {"type": "json_object"}}
        ),
        "object sampled": lambda: served.client.chat.completions.create(
            model=served.path, messages=messages, max_tokens=120, temperature=0.9, seed=1, n=2,
            response_format={"type": "json_object"},
        ),
        "schema chat streamed": lambda: _streamed_text(served.client.chat.completions.create(
            model=served.path, messages=messages, max_tokens=120, temperature=0.7, seed=11,
            response_format=JSON_SCHEMA, stream=True,
        )),
        "plain": lambda: served.complete(plain_prompt, max_tokens=40),
    }  # fmt: skip

    def ask(name: str) -> None:
        results[name] = asks[name]()

    threads = [threading.Thread(target=ask, args=(name,)) for name in asks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results) == set(asks), "a request failed; see the server's log"
    assert "response_format is served" in served.logs()
    assert results["plain"].choices[0].text == plain
    assert results["schema greedy"].choices[0].text == schema_greedy
    texts = {}
    for name in ("schema greedy", "schema sampled", "object greedy", "object sampled"):
        for choice in results[name].choices:
            assert choice.finish_reason == "stop", (name, choice)
            texts.setdefault(name, []).append(
                choice.message.content if name.startswith("object sampled") else choice.text
            )
    streamed, chunks = results["schema chat streamed"]
    assert chunks[-1].choices[0].finish_reason == "stop"
    for text in [*texts["schema greedy"], *texts["schema sampled"], streamed]:
        _follows_schema(text)
    for text in [*texts["object greedy"], *texts["object sampled"]]:
        assert isinstance(json.loads(text), dict), text
    assert texts["schema sampled"][0] != texts["schema sampled"][1]
    # Without the grammar the model writes no JSON at all.
    with pytest.raises(ValueError):
        json.loads(served.complete(prompt, max_tokens=120).choices[0].text)


def test_response_format_cut_by_max_tokens_ends_with_length(json_served):
    """max_tokens ends a constrained choice before its document does: "length", as OpenAI's; the text is
    the start of the document the greedy choice writes with room."""
    served, prompt = json_served, "the capital of france is"
    full = served.text(_constrained_greedy(served, served.ids(prompt), SCHEMA, 120))
    choice = served.complete(
        prompt, max_tokens=6, extra_body={"response_format": JSON_SCHEMA}
    ).choices[0]
    assert choice.finish_reason == "length" and full.startswith(choice.text) and choice.text
    text = served.complete(prompt, max_tokens=6, extra_body={"response_format": {"type": "text"}})
    assert text.choices[0].text == served.text(served.greedy(served.ids(prompt), 6))


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "xml"},
        {"type": "json_object", "schema": {}},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": SCHEMA}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"}},
        "json",
    ],
)
def test_bad_response_formats_are_400_and_the_server_keeps_serving(json_served, response_format):
    served = json_served
    status, body = _error(
        lambda: served.client.chat.completions.create(
            model=served.path, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format=response_format,
        )
    )  # fmt: skip
    assert status == 400 and body["param"] == "response_format" and body["message"], body
    assert served.complete(PROMPTS[3], max_tokens=2).choices[0].text


def test_response_format_on_a_tokenizer_llguidance_cannot_read_is_400(served):
    """The word-level tokenizer joins its tokens with spaces, so no grammar can be held to its tokens:
    response_format is refused, naming it; plain text ({"type": "text"}) is served as ever."""
    status, body = _error(
        lambda: served.complete(PROMPTS[3], extra_body={"response_format": {"type": "json_object"}})
    )
    assert status == 400 and body["param"] == "response_format" and "llguidance" in body["message"]
    assert "requests with a response_format are refused" in served.logs()  # said at the start
    text = served.complete(
        PROMPTS[3], max_tokens=4, extra_body={"response_format": {"type": "text"}}
    )
    assert text.choices[0].text == served.text(served.greedy(served.ids(PROMPTS[3]), 4))


def test_stop_strings_end_the_text(served):
    prompt = PROMPTS[0]
    full = served.complete(prompt, max_tokens=12).choices[0].text
    words = full.split()
    stop = words[2]
    cut = full[: full.find(stop)]
    answer = served.complete(prompt, max_tokens=12, stop=[stop, "zzz"])
    assert answer.choices[0].text == cut
    assert answer.choices[0].finish_reason == "stop"
    text, chunks = _streamed_text(served.complete(prompt, max_tokens=12, stop=stop, stream=True))
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "person", "parameters": SCHEMA}},
    {
        "type": "function",
        "function": {"name": "weather", "description": "by city", "parameters": CITY},
    },
]


def _tool_prompt(served, messages: list[dict], tools: list[dict] = TOOLS) -> list[int]:
    return list(served.tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"])  # fmt: skip


def _follows_call(name: str, arguments: str) -> None:
    if name == "person":
        _follows_schema(arguments)
    else:
        value = json.loads(arguments)
        assert set(value) == {"city"} and isinstance(value["city"], str), arguments
        assert len(value["city"]) <= 6, arguments


def _joined_calls(chunks) -> dict[int, dict]:
    """The streamed calls of choice 0, joined by index as the openai client's users join them."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for entry in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if entry.index not in calls:
                assert entry.id and entry.type == "function" and entry.function.name
                calls[entry.index] = {"name": entry.function.name, "arguments": ""}
            else:
                assert entry.id is None and entry.function.name is None
            calls[entry.index]["arguments"] += entry.function.arguments or ""
    return calls


def test_a_named_function_and_required_hold_calls_to_the_tools_schemas(tool_served):
    """tool_choice naming a function: the greedy call's arguments are the argmax of each step's masked
    logits (llguidance on transformers' logits) over the chat template's prompt with the tools, streamed
    and not; "required" without parallel calls: one call of either tool, the greedy one as that argmax
    under an array of the two calls' schemas; every sampled call parses and validates."""
    served = tool_served
    messages = [{"role": "user", "content": "who?"}]
    ids = _tool_prompt(served, messages)
    person = {"type": "function", "function": {"name": "person"}}

    def chat(**options):
        return served.client.chat.completions.create(
            model=served.path, messages=messages, tools=TOOLS, max_tokens=120, **options
        )

    want = served.text(_constrained_greedy(served, ids, SCHEMA, 120))
    greedy = chat(tool_choice=person, temperature=0)
    choice = greedy.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, call.function.arguments) == ("person", want)
    assert greedy.usage.prompt_tokens == len(ids)
    chunks = list(chat(tool_choice=person, temperature=0, stream=True))
    assert _joined_calls(chunks) == {0: {"name": "person", "arguments": want}}
    assert len([c for c in chunks if c.choices and c.choices[0].delta.tool_calls]) > 2
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    sampled = chat(tool_choice=person, temperature=1.0, seed=3, n=2)
    for choice in sampled.choices:
        _follows_call("person", choice.message.tool_calls[0].function.arguments)

    either = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": tool["function"]["name"]},
                                          "arguments": tool["function"]["parameters"]},
         "required": ["name", "arguments"], "additionalProperties": False} for tool in TOOLS
    ]}}  # fmt: skip
    want = json.loads(served.text(_constrained_greedy(served, ids, either, 120)))
    required = chat(tool_choice="required", parallel_tool_calls=False, temperature=0)
    calls = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls"
    assert [
        {"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in calls
    ] == want
    sampled = chat(tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=7, n=3)
    for choice in sampled.choices:
        [call] = choice.message.tool_calls
        _follows_call(call.function.name, call.function.arguments)
    streamed = _joined_calls(list(chat(tool_choice="required", parallel_tool_calls=False,
                                       temperature=0, stream=True)))  # fmt: skip
    assert [
        {"name": c["name"], "arguments": json.loads(c["arguments"])} for c in streamed.values()
    ] == want


def test_auto_answers_as_transformers_parses_the_greedy_text_and_earlier_calls_reach_the_template(
    tool_served,
):
    """tool_choice "auto" (the default): the answer is transformers' parse (``parse_response`` with the
    tokenizer's response template) of transformers' greedy tokens over the prompt with the tools, which
    the model was taught to make a call: its content and the call, streamed and not, ending with
    "tool_calls"; a conversation with an earlier call and its result is the prompt transformers' chat
    template makes of it (arguments as objects), answered in text with tool_choice "none"."""
    served = tool_served
    ids = _tool_prompt(served, ASKED)
    tokens = served.greedy(ids, 120)
    want = served.tokenizer.parse_response(
        served.text(tokens), prefix=served.tokenizer.decode(ids), tools=TOOLS
    )
    call = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    assert want == {"role": "assistant", "content": "Let me see.", "tool_calls": [call]}

    def ask(**options):
        return served.client.chat.completions.create(
            model=served.path, messages=ASKED, tools=TOOLS, max_tokens=120, temperature=0, **options
        )

    choice = ask().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == want["content"]
    [got] = choice.message.tool_calls
    assert (got.function.name, json.loads(got.function.arguments)) == ("weather", {"city": "Oslo"})
    chunks = list(ask(stream=True))
    text, _ = _streamed_text(chunks)
    assert text == want["content"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    [streamed] = _joined_calls(chunks).values()
    assert (streamed["name"], json.loads(streamed["arguments"])) == ("weather", {"city": "Oslo"})
    # With tool_choice "none" the same answer is text, markup and all.
    none = served.client.chat.completions.create(model=served.path, messages=ASKED, tools=TOOLS,
                                                 max_tokens=120, temperature=0, tool_choice="none")  # fmt: skip
    assert none.choices[0].message.content == served.text(tokens) == ANSWER
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"

    # A one-tool conversation (the byte-level rows hold 128 prompt tokens).
    short = [{"type": "function", "function": {"name": "w", "parameters": CITY}}]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": '{"city": "Oslo"}'},
    }
    turns = [{"role": "user", "content": "w?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]  # fmt: skip
    as_transformers = [turns[0], {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "w", "arguments": {"city": "Oslo"}}}]}, turns[2]]  # fmt: skip
    expected = _tool_prompt(served, as_transformers, short)
    assert (
        '<tool_call>{"name": "w", "arguments": {"city": "Oslo"}}</tool_call>'
        in served.tokenizer.decode(expected)
    )
    reply = served.client.chat.completions.create(
        model=served.path, messages=turns, tools=short, tool_choice="none", max_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.choices[0].message.content == served.text(served.greedy(expected, 8))
    status, body = _post(served, "/tokenize", {"messages": turns, "tools": short})
    assert status == 200 and body["tokens"] == expected


@pytest.mark.parametrize(
    "options, param",
    [
        ({"tools": TOOLS, "stop": ["x"]}, "stop"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nobody"}}},
         "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}],
          "tool_choice": "required"}, "tools"),
    ],
)  # fmt: skip
def test_tools_that_cannot_be_served_are_400_and_the_server_keeps_serving(
    tool_served, options, param
):
    served = tool_served
    status, body = _error(lambda: served.client.chat.completions.create(
        model=served.path, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **options
    ))  # fmt: skip
    assert status == 400 and body["param"] == param and body["message"], body
    assert served.complete(PROMPTS[3], max_tokens=2).choices[0].text


def test_tools_a_model_cannot_show_or_write_are_400_saying_what_works(served):
    """The word-level tokenizer's chat template shows no tools, no template says how its model writes
    calls, and llguidance cannot read it: "auto", "none" and "required" are each refused with the
    reason; the deprecated functions too."""

    def ask(**options):
        return _error(lambda: served.client.chat.completions.create(
            model=served.path, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **options
        ))  # fmt: skip

    status, body = ask(tools=TOOLS)
    assert (
        status == 400 and body["param"] == "tool_choice" and "response_template" in body["message"]
    )
    status, body = ask(tools=TOOLS, tool_choice="none")
    assert status == 400 and body["param"] == "tools" and "does not show tools" in body["message"]
    status, body = ask(tools=TOOLS, tool_choice="required")
    assert status == 400 and body["param"] == "tools" and "llguidance" in body["message"]
    status, body = ask(functions=[TOOLS[0]["function"]])
    assert status == 400 and body["param"] == "functions" and "send tools" in body["message"]


def _error(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as raised:
        call()
    return raised.value.status_code, raised.value.body


@pytest.mark.parametrize(
    "options, param",
    [
        ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": LENGTH}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {"five": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"128": 1}}, "logit_bias"),
        ({"logprobs": 9}, "logprobs"),
        ({"prompt": "one " * LENGTH}, "prompt"),
        ({"echo": "yes"}, "echo"),
        ({"echo": True, "max_tokens": -1}, "max_tokens"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": " the end"}, "suffix"),
        ({"prompt": ["a"] * 65}, "prompt"),
        ({"prompt": ["a", []]}, "prompt"),
    ],
)
def test_bad_requests_are_400_and_the_server_keeps_serving(served, options, param):
    options = {"prompt": PROMPTS[3], "max_tokens": 4, **options}
    status, body = _error(lambda: served.client.completions.create(model=served.path, **options))
    assert status == 400
    assert body["param"] == param and body["type"] == "invalid_request_error" and body["message"]
    assert served.complete(PROMPTS[3], max_tokens=2).choices[0].text


def test_unknown_model_malformed_json_and_unknown_route(served):
    status, body = _error(lambda: served.client.completions.create(model="gpt-4", prompt="a"))
    assert status == 404 and body["code"] == "model_not_found"
    request = urllib.request.Request(f"{served.url}/v1/chat/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 400
    error = json.loads(raised.value.read())["error"]
    assert set(error) == {"message", "type", "param", "code"} and "JSON" in error["message"]
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"{served.url}/v1/engines", timeout=10)
    assert raised.value.code == 404


def test_sixteen_concurrent_clients_get_their_single_answers(served):
    """16 clients at once (8 rows, the rest waiting): each greedy answer equals the one it gets alone and
    transformers' own."""
    jobs = [(PROMPTS[i % len(PROMPTS)], 4 + 3 * i) for i in range(16)]
    alone = [served.complete(p, max_tokens=n).choices[0].text for p, n in jobs]
    together: list[str | None] = [None] * len(jobs)

    def ask(i: int) -> None:
        prompt, n = jobs[i]
        together[i] = served.complete(prompt, max_tokens=n).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    for (prompt, n), text in zip(jobs, alone):
        assert text == served.text(served.greedy(served.ids(prompt), n))


def _long_prompt(served) -> str:
    """A prompt whose greedy continuation runs to the end of its row without an EOS token."""
    for prompt in PROMPTS:
        if len(served.greedy(served.ids(prompt), LENGTH - 16)) == LENGTH - 16:
            return prompt
    pytest.skip("every prompt's continuation ends early")


def test_disconnect_mid_stream_frees_the_row(served):
    prompt = _long_prompt(served)
    before = served.metrics()
    stream = served.complete(prompt, max_tokens=LENGTH - 16, stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 20
    while served.metrics()["hfax_batch_occupancy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = served.metrics()
    assert after["hfax_batch_occupancy"] == 0
    generated = after["hfax_generation_tokens_total"] - before["hfax_generation_tokens_total"]
    assert generated < LENGTH - 16, "the request ran to its end: the disconnect freed nothing"
    assert re.search(r"row \d+ cancelled", served.logs())
    assert served.complete(PROMPTS[3], max_tokens=2).choices[0].text


def test_full_queue_answers_429(served):
    prompt = _long_prompt(served)
    statuses: list[int] = []

    def ask() -> None:
        try:
            served.complete(prompt, max_tokens=LENGTH - 16)
            statuses.append(200)
        except openai.RateLimitError as error:
            assert error.body["type"] == "rate_limit_error"
            statuses.append(429)

    threads = [threading.Thread(target=ask) for _ in range(2 * (SLOTS + QUEUE))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses.count(429) >= 1 and statuses.count(200) >= SLOTS
    assert served.metrics()["hfax_requests_rejected_total"] >= statuses.count(429)
    assert served.complete(PROMPTS[3], max_tokens=2).choices[0].text


def test_programs_compile_per_prompt_bucket_only(served):
    """New sampling settings, seeds, lengths and choice counts compile nothing; a new prompt bucket
    compiles its prefill once."""
    served.complete(PROMPTS[0], max_tokens=3)
    before = served.metrics()["hfax_compiles_total"]
    for i, prompt in enumerate(PROMPTS):
        served.complete(prompt, max_tokens=2 + i, temperature=0.1 * i, top_p=1 - 0.05 * i,
                        seed=i, n=1 + i % 3)  # fmt: skip
    assert served.metrics()["hfax_compiles_total"] == before
    long_prompts = [" ".join(["the"] * 20), " ".join(["a"] * 27)]  # both in the 32-token bucket
    for prompt in long_prompts:
        served.complete(prompt, max_tokens=3, temperature=0.5)
    assert served.metrics()["hfax_compiles_total"] == before + 1


def _prefixed(seed: int, length: int) -> list[int]:
    """A prompt's first ``length`` token ids: BOS, then words drawn with ``seed``."""
    return [1, *np.random.default_rng(seed).integers(4, 128, length - 1).tolist()]


def _reused(served) -> float:
    return served.metrics()["hfax_prefix_reused_tokens_total"]


def _check_against_transformers(served, ids: list[int], choice, max_new: int) -> None:
    """``choice``'s tokens are transformers' greedy ones and their logprobs its log-softmax (1e-4)."""
    import torch

    expected = served.greedy(ids, max_new)
    assert choice.logprobs.tokens == [served.tokenizer.decode([t]) for t in expected]
    with torch.no_grad():
        logits = served.reference(torch.tensor([ids + expected])).logits[0, len(ids) - 1 : -1]
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(expected)), expected].numpy()
    np.testing.assert_allclose(choice.logprobs.token_logprobs, want, atol=1e-4)


def test_requests_sharing_a_prefix_reuse_it_and_answer_as_transformers(served):
    """Prefix caching (hfax.serve.prefixes): a 43-token prompt is prefilled whole and its first 32 tokens
    kept; a prompt beginning with the same 40 then prefills only its last 10, reading 32 from the store.
    Both get transformers' greedy tokens and log-softmax (1e-4); so does a prompt that is exactly a kept
    prefix (32 tokens, 31 of them reused: its last token is prefilled for its logits)."""
    assert served.metrics()["hfax_prefix_store_entries"] == 4  # the fixture's --prefix-cache 4
    prefix = _prefixed(1, 40)
    before = _reused(served)
    for ids in (prefix + [10, 11, 12], prefix + [20, 21]):
        _check_against_transformers(
            served, ids, served.complete(ids, max_tokens=8, logprobs=1).choices[0], 8
        )
    assert _reused(served) - before == 32
    exact = _prefixed(3, 32)
    served.complete(exact + [5], max_tokens=2)  # kept: its first 32 tokens
    before = _reused(served)
    _check_against_transformers(
        served, exact, served.complete(exact, max_tokens=8, logprobs=1).choices[0], 8
    )
    assert _reused(served) - before == 31


def test_concurrent_requests_with_one_new_prefix_answer_as_transformers(served):
    """Two clients at once with one prefix no entry holds yet, and different suffixes: whether admitted in
    one turn (the first prefilled whole and kept, the second reusing it after) or one after the other,
    each gets transformers' tokens and logprobs, and 48 tokens are reused. Seeded sampling with n=2 on
    a third new prefix (choice 0 kept, choice 1 reusing it in the same turn) draws what hfax's
    generate draws for two copies of the prompt."""
    prefix = _prefixed(2, 50)
    jobs = [prefix + [7, 8, 9], prefix + [30, 31]]
    answers: list = [None, None]
    before = _reused(served)

    def ask(i: int) -> None:
        answers[i] = served.complete(jobs[i], max_tokens=8, logprobs=1).choices[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for ids, choice in zip(jobs, answers):
        _check_against_transformers(served, ids, choice, 8)
    assert _reused(served) - before == 48
    ids = _prefixed(5, 45) + [9, 10]
    before = _reused(served)
    options = dict(max_tokens=10, temperature=0.8, top_p=0.9, seed=1234, n=2)
    answer = served.complete(ids, **options)
    assert _reused(served) - before == 32
    out = served.jax_model.generate(
        np.array([ids, ids]), max_new_tokens=10, do_sample=True, temperature=0.8, top_p=0.9,
        top_k=0, seed=1234,
    )  # fmt: skip
    expected = [served.text(_until_eos(row[len(ids) :].tolist())) for row in np.asarray(out)]
    assert [c.text for c in answer.choices] == expected and expected[0] != expected[1]


def test_an_evicted_prefix_is_prefilled_again_and_kept_again(served):
    """A prefix kept, then pushed out of the store (least recently used first) by as many new prefixes as
    the store has entries: asked again, it is prefilled whole (nothing reused) with transformers'
    answer, kept again, and reused by the request after."""
    prefix = _prefixed(6, 33)
    served.complete(prefix + [4], max_tokens=2)
    for seed in range(int(served.metrics()["hfax_prefix_store_entries"])):
        served.complete(_prefixed(100 + seed, 40), max_tokens=2)
    before = _reused(served)
    for ids in (prefix + [11, 12], prefix + [13]):
        _check_against_transformers(
            served, ids, served.complete(ids, max_tokens=8, logprobs=1).choices[0], 8
        )
    assert _reused(served) - before == 32  # the second request's only


def test_a_model_with_a_sliding_window_reuses_prefixes_with_transformers_tokens(tmp_path_factory):
    """A model with a sliding window (a tiny Mistral, window 5) keeps prefixes: of two prompts sharing 40
    tokens the second reuses the first's 32 stored ones, and both get transformers' tokens."""
    import hfax
    from hfax import serve
    from hfax.generation.rows import Sampling
    from hfax.serve.scheduler import Scheduler, Sequence
    from hfax.testing import reference_generate, tiny_models

    _, reference, model = tiny_models(tmp_path_factory.mktemp, backend="jax")("mistral")
    engine = serve.engine(hfax.get_backend("jax"), model, slots=2, length=96, prefixes=4)
    assert engine.prefixes == 4 and engine.prefix_refusal == ""
    scheduler = Scheduler(engine, [2], max_queue=4)
    prefix = _prefixed(7, 40)
    prompts = [prefix + [5, 6], prefix + [8]]
    got: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Semaphore(0)

    def deliver(i: int):
        def take(event) -> None:
            got[i] += event.ids
            if event.finish:
                done.release()

        return take

    try:
        for i, ids in enumerate(prompts):
            scheduler.submit([Sequence(ids, 8, Sampling(0.0), deliver(i))])
            assert done.acquire(timeout=120)
    finally:
        scheduler.close()
    for i, ids in enumerate(prompts):
        out = reference_generate(reference, np.array([ids]), max_new_tokens=8)[0]
        assert got[i] == _until_eos(out[len(ids) :].tolist())
    assert scheduler.counters.reused_tokens == 32


def test_a_long_prompt_prefilled_in_pieces_answers_as_transformers(tmp_path_factory):
    """``hfax serve --prefill-chunk 16``: a prompt of more than 48 tokens is prefilled a piece per turn
    while another request streams; both get transformers' greedy text, /metrics counts the pieces, and
    nothing compiles for them (the pieces' programs compiled before the server listened)."""
    server = Served(
        tmp_path_factory.mktemp("serve-pieces"), slots=2, options=("--prefill-chunk", "16")
    )
    try:
        short, long = PROMPTS[0], " ".join(PROMPTS)
        ids = server.ids(long)
        assert len(ids) > 48
        server.complete(short, max_tokens=2)  # the short prompt's bucket compiled
        before = server.metrics()
        streamed: dict[str, str] = {}

        def stream() -> None:
            streamed["text"] = _streamed_text(server.complete(short, max_tokens=40, stream=True))[0]

        thread = threading.Thread(target=stream)
        thread.start()
        text = server.complete(long, max_tokens=12).choices[0].text
        thread.join()
        after = server.metrics()
        assert text == server.text(server.greedy(ids, 12))
        assert streamed["text"] == server.text(server.greedy(server.ids(short), 40))
        pieces = after["hfax_prefill_pieces_total"] - before["hfax_prefill_pieces_total"]
        assert pieces == -(-len(ids) // 16)
        assert after["hfax_compiles_total"] == before["hfax_compiles_total"]
    finally:
        server.stop()
        server.log.close()


def test_readme_client_example_runs(served, capsys):
    """The README's openai-client block, pointed at this server and its model."""
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    serving = readme[readme.index("## Serving") :]
    block = re.search(r"^```py\n(.*?)^```", serving, flags=re.DOTALL | re.MULTILINE).group(1)
    assert "http://127.0.0.1:8000/v1" in block and '"google/gemma-3-270m"' in block
    source = block.replace("http://127.0.0.1:8000/v1", f"{served.url}/v1")
    exec(
        compile(source.replace('"google/gemma-3-270m"', repr(served.path)), "README.md", "exec"), {}
    )
    assert capsys.readouterr().out.strip()


def test_shutdown_finishes_in_flight_requests(served):
    """SIGTERM: a stream under way runs to its end, then the server exits cleanly."""
    prompt = _long_prompt(served)
    result: dict = {}

    def ask() -> None:
        result["text"], chunks = _streamed_text(
            served.complete(prompt, max_tokens=LENGTH - 16, stream=True)
        )
        result["finish"] = chunks[-1].choices[0].finish_reason

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.monotonic() + 20
    while not served.metrics()["hfax_batch_occupancy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.stop() == 0
    thread.join(timeout=30)
    assert result["finish"] == "length"
    assert result["text"] == served.text(served.greedy(served.ids(prompt), LENGTH - 16))


def test_cli_refuses_bad_options_in_one_line():
    for args, message in [
        (["--max-batch", "0"], "--max-batch"),
        (["--port", "0"], "--port"),
        (["--prefix-cache", "-1"], "--prefix-cache"),
        (["--prefill-chunk", "-1"], "--prefill-chunk"),
        (["--prefill-chunk", "64", "--max-len", "64"], "--prefill-chunk"),
        (["--prompt-lookup", "-1"], "--prompt-lookup"),
        (["--prompt-lookup", "17"], "--prompt-lookup"),
    ]:
        run = subprocess.run(
            [sys.executable, "-c", "from hfax.cli import main; main()", "serve", *args],
            capture_output=True, text=True, env={**os.environ}, timeout=120,
        )  # fmt: skip
        assert run.returncode == 2
        assert run.stderr.startswith("hfax: error:") and message in run.stderr
        assert "Traceback" not in run.stderr
