"""Accelerate's examples/nlp_example.py, the same steps written again for tests: a BERT classifier fine-tuned on a
paraphrase task, with the Hub's model, tokenizer, data and metric replaced by tiny_mrpc's local ones. The script is
written against Accelerate; tests/accelerate/test_nlp_examples.py runs it as it is and with the import of
Accelerator swapped for the runner's, and compares what both record.

--record DIR writes what the run did: each process's loss at every step (losses_rank<N>.json) and, from the main
process, the metric after each epoch (metrics.json).
"""

import argparse

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup, set_seed

import tiny_mrpc
from accelerate import Accelerator, DistributedType

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


def get_dataloaders(accelerator, batch_size: int = 16):
    tokenizer = tiny_mrpc.tokenizer()
    datasets = tiny_mrpc.load_dataset()

    def tokenize_function(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)

    # The main process maps first, so that the others read its cache.
    with accelerator.main_process_first():
        tokenized = datasets.map(tokenize_function, batched=True, remove_columns=["idx", "sentence1", "sentence2"])
    tokenized = tokenized.rename_column("label", "labels")

    def collate_fn(examples):
        # XLA wants one shape; mixed precision wants lengths a multiple of 8 (16 for fp8).
        max_length = 128 if accelerator.distributed_type == DistributedType.XLA else None
        multiple = 16 if accelerator.mixed_precision == "fp8" else 8 if accelerator.mixed_precision != "no" else None
        return tokenizer.pad(examples, padding="longest", max_length=max_length, pad_to_multiple_of=multiple,
                             return_tensors="pt")

    train = DataLoader(tokenized["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size,
                       drop_last=True)
    evaluation = DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate_fn,
                            batch_size=EVAL_BATCH_SIZE, drop_last=(accelerator.mixed_precision == "fp8"))
    return train, evaluation


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr, num_epochs, seed, batch_size = config["lr"], int(config["num_epochs"]), config["seed"], config["batch_size"]
    metric = tiny_mrpc.Metric()

    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = tiny_mrpc.model().to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=config["warmup_steps"],
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    losses, metrics = [], []
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
            loss = model(**batch).loss / gradient_accumulation_steps
            losses.append(loss.item())
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        for batch in eval_dataloader:
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            metric.add_batch(predictions=predictions, references=references)
        metrics.append(metric.compute())
        accelerator.print(f"epoch {epoch}:", metrics[-1])
    accelerator.end_training()

    if args.record:
        tiny_mrpc.record(args.record, f"losses_rank{accelerator.process_index}.json", losses)
        if accelerator.is_main_process:
            tiny_mrpc.record(args.record, "metrics.json", {"metrics": metrics,
                                                           "mixed_precision": accelerator.mixed_precision,
                                                           "num_processes": accelerator.num_processes})


def main():
    parser = argparse.ArgumentParser(description="Accelerate's nlp_example on a local tiny BERT and task.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--record", type=str, default=None, help="Write per-step losses and metrics here.")
    args = parser.parse_args()
    # Accelerate's: lr 2e-5, 100 warmup steps (for a pretrained BERT over 3 epochs of MRPC); this model starts from
    # scratch and takes 30 steps.
    config = {"lr": 1e-2, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup_steps": 3}
    training_function(config, args)


if __name__ == "__main__":
    main()
