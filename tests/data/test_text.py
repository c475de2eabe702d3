"""The language-model path: tokenizers, token streams, the GPT, sampling, and streaming past the memory budget."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from matrix_data import corpus
from runner.data import make_batches, text_files
from runner.data.tokenizers import BytePairEncoding, CharLevel, load_tokenizer
from runner.errors import ConfigError
from runner.models import GPT
from runner.commands.sample import SampleSettings, sample
from runner.training.tasks import LanguageModeling

def test_char_tokenizer_round_trips_and_saves(tmp_path):
    text = "hello, world\nsecond line é\n"
    tokenizer = CharLevel(vocab_size=64).train([[text]])
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("hz")[1] == tokenizer.unk_id  # 'z' is not in the training text
    tokenizer.save(tmp_path)
    assert load_tokenizer(tmp_path).tokens == tokenizer.tokens
    capped = CharLevel(vocab_size=5).train([["aaab"]])
    assert capped.vocab_size == 4 and capped.decode(capped.encode("ab")) == "ab"


def test_bpe_tokenizer_round_trips(tmp_path):
    text = corpus(200)
    tokenizer = BytePairEncoding(vocab_size=300).train([text.splitlines(keepends=True)])
    assert 258 < tokenizer.vocab_size <= 300
    assert tokenizer.decode(tokenizer.encode(text[:200])) == text[:200]
    tokenizer.save(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file() and load_tokenizer(tmp_path).encode("the cat").tolist() == \
        tokenizer.encode("the cat").tolist()


def test_text_files_blocks_are_the_text_shifted_by_one(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(corpus(400))
    splits = text_files(str(path), CharLevel(), block_size=16, tokenizer_dir=str(tmp_path / "tok"))
    tokenizer = load_tokenizer(tmp_path / "tok")
    stream = splits["train"].tokens()
    assert tokenizer.decode(stream[:50]) == path.read_text()[:50]
    assert len(stream) + len(splits["validation"]) == len(path.read_text())  # every character, newlines too
    batches = make_batches(splits["train"], 8, True, 0, 64)
    batch = next(iter(batches))
    assert batch["input_ids"].shape == (8, 16) and batch["input_ids"].dtype == torch.int64
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    # The epoch's order and cut come from seed + epoch: the same again, different in the next epoch.
    first = next(iter(batches))["input_ids"]
    assert torch.equal(first, batch["input_ids"])
    start = int(batches._order()[0]) * 16 + batches.offset
    assert torch.equal(first[0], torch.from_numpy(stream[start : start + 16].astype(np.int64)))
    batches.set_epoch(1)
    assert not torch.equal(next(iter(batches))["input_ids"], first)
    evaluation = make_batches(splits["validation"], 4, False, 0, 64)
    assert sum(len(b["labels"]) for b in evaluation) == (len(splits["validation"]) - 1) // 16


def test_token_path_memory_maps_past_the_budget(tmp_path):
    """A corpus larger than trainer.data_in_memory_mb (1 MB): the batches read from the token file's memory map,
    never a copy of the stream, and give exactly the batches of the in-memory path."""
    path = tmp_path / "big.txt"
    path.write_text(corpus(50_000))  # ~1.4 MB of text: 5.6 MB as int32 tokens in memory
    assert path.stat().st_size > 2**20
    splits = text_files(str(path), CharLevel(), block_size=32)
    streamed = make_batches(splits["train"], 64, True, 3, in_memory_limit_mb=1)
    in_memory = make_batches(splits["train"], 64, True, 3, in_memory_limit_mb=64)
    assert isinstance(streamed.tokens, np.memmap) and isinstance(in_memory.tokens, torch.Tensor)
    assert str(streamed.tokens.filename) == str(splits["train"].path)  # the cached token file itself, read lazily
    for _, (a, b) in zip(range(5), zip(streamed, in_memory)):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])


def _train(splits, steps: int) -> GPT:
    torch.manual_seed(0)
    model = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    task, batches = LanguageModeling(), make_batches(splits["train"], 16, True, 0, 64)
    step = 0
    while step < steps:
        for batch in batches:
            task.training_loss(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == steps:
                break
        batches.set_epoch(step)
    return model.eval()


def test_trained_gpt_beats_the_unigram_baseline(tmp_path):
    """Its samples hold only characters of its vocabulary."""
    path = tmp_path / "t.txt"
    path.write_text(corpus(600))
    run_dir = tmp_path / "run"
    splits = text_files(str(path), CharLevel(vocab_size=64), block_size=16, tokenizer_dir=str(run_dir / "tokenizer"))
    model = _train(splits, steps=150)
    task = LanguageModeling()
    with torch.no_grad():
        stats = [task.evaluation_stats(model, b) for b in make_batches(splits["validation"], 64, False, 0, 64)]
    val_loss = task.summarize({k: sum(s[k] for s in stats) for k in stats[0]})["loss"]
    counts = Counter(splits["train"].tokens().tolist())
    total = sum(counts.values())
    unigram = -sum(c / total * math.log(c / total) for c in counts.values())  # the best loss without context
    assert val_loss < unigram - 0.5, (val_loss, unigram)

    from safetensors.torch import save_model

    (run_dir / "export").mkdir(parents=True)
    save_model(model, str(run_dir / "export" / "final.safetensors"))
    import yaml

    (run_dir / "export" / "config.yaml").write_text(yaml.safe_dump({"allowed_targets": ["runner."], "model": {
        "_target_": "runner.models.GPT", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}}))
    texts = sample(run_dir, SampleSettings(prompt="the ", max_new_tokens=80, top_k=None, temperature=1.5,
                                           num_samples=3))
    vocabulary = set(path.read_text())
    assert all(text.startswith("the ") and len(text) == 84 and set(text) <= vocabulary for text in texts)


def test_perplexity_and_tokens_per_sample():
    assert LanguageModeling(tokens_per_sample=64).tokens_per_sample == 64
    stats = {"loss_sum": torch.tensor(2.0, dtype=torch.float64), "correct": torch.tensor(1.0, dtype=torch.float64),
             "count": torch.tensor(2.0, dtype=torch.float64)}
    assert LanguageModeling.summarize(stats) == pytest.approx({"loss": 1.0, "accuracy": 0.5, "perplexity": math.e})
    assert set(LanguageModeling.metric_names) == set(LanguageModeling.summarize(stats))


def test_sample_names_bad_settings():
    from runner.errors import ConfigError
    from runner.commands.sample import parse

    path, settings = parse(["run", "prompt=ROMEO:", "top_k=0", "temperature=0.5"])
    assert (settings.prompt, settings.top_k, settings.temperature) == ("ROMEO:", None, 0.5)
    with pytest.raises(ConfigError, match="temprature: is not a setting of `runner sample`"):
        parse(["run", "temprature=1"])
    # Values the sampler cannot use are named before any model is built (not a traceback, not blank text).
    for setting, message in [("top_k=-5", "top_k: is -5; it must be 1 or more"),
                             ("num_samples=-1", "num_samples: is -1; it must be 1 or more"),
                             ("max_new_tokens=-3", "max_new_tokens: is -3; it must be 1 or more"),
                             ("temperature=-1", "temperature: is -1.0; it must be above 0")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse(["run", setting])


def test_runner_sample_bad_setting_exits_1(capsys):
    """`runner sample` ends a bad setting with one error line and exit code 1."""
    from runner.commands.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["sample", "run", "temprature=1"])
    assert ended.value.code == 1
    assert capsys.readouterr().err.startswith("runner: error: bad config: temprature: is not a setting of `runner sample`")


def test_bag_of_ngrams_ignores_padding_not_order():
    """It tells word order apart by its bigrams."""
    from runner.models import BagOfNgrams

    torch.manual_seed(0)
    model = BagOfNgrams(vocab_size=10, num_classes=3, dim=8, buckets=16).eval()
    text = torch.tensor([[3, 4, 5]])
    padded = torch.tensor([[3, 4, 5, 0, 0, 0]])  # the same text in a batch whose longest text is 6 tokens
    # equal up to the order of a float sum (a longer row is reduced in other chunks), float32's rounding
    torch.testing.assert_close(model(text), model(padded), rtol=1e-6, atol=1e-7)
    reordered = torch.tensor([[5, 4, 3]])  # the same tokens, other bigrams
    assert not torch.allclose(model(text), model(reordered))
    unigrams_only = BagOfNgrams(vocab_size=10, num_classes=3, dim=8, buckets=0).eval()
    assert torch.allclose(unigrams_only(text), unigrams_only(reordered))
    with pytest.raises(ConfigError, match="model.num_classes: is 1; it must be 2 or more"):
        BagOfNgrams(vocab_size=10, num_classes=1)
