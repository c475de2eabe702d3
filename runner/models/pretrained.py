"""A `transformers` model with pretrained weights, by Hub name or local directory (online users). Offline, a name
missing from the Hugging Face cache fails in seconds, naming the model and the cache to fill.

For a randomly initialised model (offline too), use `transformers.AutoModelForCausalLM.from_config` with the
architecture's config as a nested `_target_` (conf/model/hf_causal_lm.yaml).
"""

from __future__ import annotations

AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoModelForMaskedLM", "AutoModel")


def from_pretrained(name: str, auto_class: str = "AutoModelForCausalLM", **kwargs):
    """`transformers.<auto_class>.from_pretrained(name, **kwargs)`, e.g. num_labels=4 for sequence classification."""
    from runner.errors import ConfigError
    from runner.hub import load_pretrained

    if auto_class not in AUTO_CLASSES:
        raise ConfigError("model.auto_class", f"'{auto_class}' is not one of {', '.join(AUTO_CLASSES)}")
    return load_pretrained(auto_class, name, "model.name", **kwargs)
