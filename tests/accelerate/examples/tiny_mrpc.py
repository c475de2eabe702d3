"""What Accelerate's NLP examples fetch from the Hub, made here: a small paraphrase task in GLUE MRPC's columns
(idx, sentence1, sentence2, label), a BERT tokenizer over its words, a tiny BERT classifier and MRPC's metric
(accuracy and F1). Nothing is downloaded; the same seed gives the same rows, vocabulary and weights everywhere.

A pair is a paraphrase (label 1) when sentence2 says sentence1 again with synonyms swapped in and two words
exchanged, and not (label 0) when sentence2 is another sentence built from the same words.
"""

from __future__ import annotations

import json
import os
import random

from datasets import Dataset, DatasetDict
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
SYNONYMS = {"big": "large", "quick": "fast", "said": "stated", "bought": "acquired", "firm": "company",
            "shares": "stocks", "rose": "climbed", "fell": "dropped", "today": "now", "city": "town"}
SUBJECTS = ["the firm", "the city", "the board", "a trader", "the bank", "our team"]
VERBS = ["said", "bought", "rose", "fell", "sold", "reported"]
OBJECTS = ["big shares", "quick gains", "the city bonds", "new offices", "its rival", "more shares"]
ENDINGS = ["today", "on monday", "last week", "in march", "after the vote", "before noon"]
WORDS = sorted({word for phrase in SUBJECTS + VERBS + OBJECTS + ENDINGS for word in phrase.split()}
               | set(SYNONYMS.values()))


def _sentence(rng: random.Random) -> str:
    return " ".join([rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDINGS)])


def _paraphrase(sentence: str, rng: random.Random) -> str:
    words = [SYNONYMS.get(word, word) for word in sentence.split()]
    i, j = rng.sample(range(len(words)), 2)
    words[i], words[j] = words[j], words[i]
    return " ".join(words)


def _split(rows: int, seed: int, offset: int) -> Dataset:
    rng = random.Random(seed)
    columns = {"idx": [], "sentence1": [], "sentence2": [], "label": []}
    for index in range(rows):
        first, label = _sentence(rng), rng.randint(0, 1)
        second = _paraphrase(first, rng) if label else _sentence(rng)
        for key, value in zip(columns, (offset + index, first, second, label)):
            columns[key].append(value)
    return Dataset.from_dict(columns)


def load_dataset(train_rows: int = 160, validation_rows: int = 48, seed: int = 0) -> DatasetDict:
    """In place of datasets.load_dataset("nyu-mll/glue", "mrpc")."""
    return DatasetDict(train=_split(train_rows, seed, 0), validation=_split(validation_rows, seed + 1, train_rows))


def tokenizer() -> PreTrainedTokenizerFast:
    """In place of AutoTokenizer.from_pretrained("bert-base-cased"): the same inputs for a pair ([CLS] a [SEP] b
    [SEP], token_type_ids, attention_mask) over this task's words."""
    vocab = {word: index for index, word in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", model_max_length=64,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def model() -> BertForSequenceClassification:
    """In place of AutoModelForSequenceClassification.from_pretrained("bert-base-cased"): two layers of width 32,
    initialised from the global RNG (the examples call set_seed just before)."""
    config = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return BertForSequenceClassification(config)


class Metric:
    """In place of evaluate.load("glue", "mrpc"): add_batch, then compute gives accuracy and F1 of all batches."""

    def __init__(self):
        self.predictions: list[int] = []
        self.references: list[int] = []

    def add_batch(self, predictions, references) -> None:
        self.predictions += [int(p) for p in predictions]
        self.references += [int(r) for r in references]

    def compute(self) -> dict:
        pairs = list(zip(self.predictions, self.references))
        self.predictions, self.references = [], []
        true_positive = sum(p == r == 1 for p, r in pairs)
        predicted, actual = sum(p for p, _ in pairs), sum(r for _, r in pairs)
        f1 = 2 * true_positive / (predicted + actual) if predicted + actual else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / len(pairs), "f1": f1, "count": len(pairs)}


def record(directory: str, name: str, value) -> None:
    """Write `value` as JSON to directory/name whole (a temporary file renamed): the test reads the records of a
    run whose process it may have had to stop after they were all written (test_nlp_examples.run)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(f"{path}.part", "w", encoding="utf-8") as file:
        json.dump(value, file)
    os.replace(f"{path}.part", path)
