"""Generate text from a trained language model with the tokenizer its run saved.

    python -m runner sample <run dir | checkpoint dir | .safetensors file> prompt="CORIOLANUS." max_new_tokens=200 \\
        temperature=0.8 top_k=200 num_samples=1 seed=0

A run dir samples from export/final.safetensors (or, before the run has finished, its newest checkpoint); a
checkpoint dir (checkpoints/step_N) or an exported file (export/best.safetensors) from exactly those weights. The
model is rebuilt from the config saved beside the weights, and the tokenizer read from <run dir>/tokenizer. Ids the
tokenizer does not have, and its special ids, are never drawn, so the text uses only the tokenizer's vocabulary.

A run dir is data, like a checkpoint, and may come from someone else: the model's `_target_` in its config must sit
under the prefixes this command allows (the schema's default allowed_targets, or `allowed_targets=[...]` given here),
never under the ones that config lists for itself.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import torch

from runner.errors import ConfigError, RunnerError, exit_with

USAGE = ('usage: python -m runner sample <run dir | checkpoint dir | .safetensors file> [prompt="..."] '
         "[max_new_tokens=200] [temperature=0.8] [top_k=200] [num_samples=1] [seed=0] [allowed_targets=[runner.,...]]")


def default_allowed_targets() -> list[str]:
    from runner.config.schema import RunConfig

    return RunConfig().allowed_targets


@dataclass
class SampleSettings:
    prompt: str = "\n"
    """Text to continue (default: a newline, i.e. a fresh line)."""
    max_new_tokens: int = 200
    temperature: float = 0.8
    """Below 1: more predictable text; above 1: more varied."""
    top_k: Optional[int] = 200
    """Draw only among the k most likely tokens (None or 0: all of them)."""
    num_samples: int = 1
    seed: int = 0
    allowed_targets: Optional[list] = None
    """Module prefixes the model's `_target_` may come from (None: the schema's default allowed_targets)."""


def parse(argv: list[str]) -> tuple[Path, SampleSettings]:
    if not argv or "=" in argv[0]:
        raise ConfigError("sample", f"name a run dir, checkpoint dir or .safetensors file first\n{USAGE}")
    types = {field.name: field.type for field in fields(SampleSettings)}
    settings = SampleSettings()
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in types:
            raise ConfigError(key, f"is not a setting of `runner sample`; valid: {', '.join(types)}\n{USAGE}")
        try:
            if key == "prompt":
                parsed = value.encode().decode("unicode_escape")  # prompt="\n" means a newline
            elif key == "top_k" and value.lower() in ("none", "null", "0"):
                parsed = None
            elif key == "allowed_targets":
                parsed = [prefix.strip() for prefix in value.strip("[]").split(",") if prefix.strip()]
            else:
                parsed = (int if key in ("max_new_tokens", "top_k", "num_samples", "seed") else float)(value)
        except ValueError:
            raise ConfigError(key, f"'{value}' is not a valid {types[key]}") from None
        setattr(settings, key, parsed)
    least = {"max_new_tokens": 1, "num_samples": 1, "top_k": 1}
    for key, minimum in least.items():
        value = getattr(settings, key)
        if value is not None and value < minimum:
            every = " (or 0 / none: every token)" if key == "top_k" else ""
            raise ConfigError(key, f"is {value}; it must be {minimum} or more{every}")
    if not settings.temperature > 0:
        raise ConfigError("temperature", f"is {settings.temperature}; it must be above 0 (0.8 is a usual choice; "
                                         "lower is more predictable)")
    return Path(argv[0]), settings


def locate(path: Path) -> tuple[Path, Path, Path]:
    """(weights file, the config.yaml beside them, the run dir) for a run dir, checkpoint dir or weights file."""
    if not path.exists():
        raise ConfigError("sample", f"no such run dir or file '{path}' (looked in {path.absolute().parent}); give a "
                          "run dir (with export/ or checkpoints/), a checkpoints/step_N dir or a .safetensors file")
    if path.is_file() and path.suffix == ".safetensors":
        return path, path.parent / "config.yaml", path.parent.parent
    if (path / "model.safetensors").is_file():
        return path / "model.safetensors", path / "config.yaml", path.parent.parent
    if (path / "export" / "final.safetensors").is_file():
        return path / "export" / "final.safetensors", path / "export" / "config.yaml", path
    latest = path / "checkpoints" / "latest"
    if latest.is_file():
        checkpoint = path / "checkpoints" / latest.read_text().strip()
        return checkpoint / "model.safetensors", checkpoint / "config.yaml", path
    raise ConfigError("sample", f"{path} holds no weights: give a run dir (with export/ or checkpoints/), a "
                      "checkpoints/step_N dir or a .safetensors file")


def load_model(weights: Path, config_file: Path, allowed_targets: list[str] | None = None) -> torch.nn.Module:
    """The model of `config_file`, built when its targets sit under `allowed_targets` (None: the schema's default),
    never under the allowed_targets that file lists: a config read from a run dir may not widen what runs."""
    from safetensors.torch import load_model as load_weights

    from runner.config.instantiate import build_model, data_target_problems, target_problems, targets_outside

    from runner.training.checkpointer import read_config

    allowed = default_allowed_targets() if allowed_targets is None else allowed_targets
    config = read_config(config_file)
    outside = targets_outside("model", config["model"], allowed)
    if outside:
        key, target = outside[0]
        raise ConfigError("allowed_targets", (
            f"{key} in {config_file} is '{target}', outside the prefixes `runner sample` allows "
            f"({', '.join(allowed)}); a run dir's own allowed_targets cannot widen them. If you trust that code, "
            f"allow its package here: runner sample ... allowed_targets=[{','.join(allowed)},{target.split('.')[0]}.]"))
    problems = (target_problems({"model": config["model"]}, allowed)
                or data_target_problems("model", config["model"], str(config_file)))
    if problems:
        raise ConfigError(problems)
    model = build_model(config["model"])
    load_weights(model, str(weights))
    return model.eval()


def context_length(model: torch.nn.Module) -> int:
    if hasattr(model, "block_size"):
        return model.block_size
    config = getattr(model, "config", None)  # a transformers model
    for name in ("n_positions", "max_position_embeddings"):
        if getattr(config, name, None):
            return getattr(config, name)
    raise ConfigError("model", f"cannot tell the context length of a {type(model).__name__}")


@torch.no_grad()
def generate(model, ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
             allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Extend `ids` (batch, length) by sampling one token at a time from the last position's logits, among the
    `allowed` ids (a boolean mask over the model's vocabulary), with the context cropped to what the model takes."""
    context = context_length(model)
    for _ in range(max_new_tokens):
        output = model(ids[:, -context:])
        logits = getattr(output, "logits", output)[:, -1, :].float()
        logits = logits.masked_fill(~allowed[: logits.shape[-1]], float("-inf")) / max(temperature, 1e-6)
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        next_ids = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, next_ids], dim=1)
    return ids


def sample(path: Path, settings: SampleSettings) -> list[str]:
    from runner.data.tokenizers import load_tokenizer

    weights, config_file, run_dir = locate(path)
    model = load_model(weights, config_file, settings.allowed_targets)
    tokenizer = load_tokenizer(run_dir / "tokenizer")
    vocab = model(torch.zeros(1, 1, dtype=torch.long))
    allowed = torch.zeros(getattr(vocab, "logits", vocab).shape[-1], dtype=torch.bool)
    allowed[: tokenizer.vocab_size] = True
    allowed[list(tokenizer.special_ids)] = False
    prompt = torch.as_tensor(tokenizer.encode(settings.prompt), dtype=torch.long)
    if prompt.numel() == 0:
        raise ConfigError("prompt", "encodes to no tokens; give some text")
    generator = torch.Generator().manual_seed(settings.seed)
    ids = generate(model, prompt.repeat(settings.num_samples, 1), settings.max_new_tokens, settings.temperature,
                   settings.top_k, allowed, generator)
    return [tokenizer.decode(row.tolist()) for row in ids]


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        path, settings = parse(arguments)
        texts = sample(path, settings)
    except RunnerError as err:
        exit_with(err)
    print("\n---------------\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
