"""Accelerate's examples/complete_nlp_example.py, the same steps written again for tests: nlp_example plus
checkpoints every N steps or every epoch (save_state), resuming from one (load_state, skip_first_batches) and
experiment tracking (log_with="all", init_trackers, log), on tiny_mrpc's local model, tokenizer, data and metric.
Written against Accelerate; tests/accelerate/test_nlp_examples.py runs it as it is and with the import swapped for the
runner's.

--record DIR writes what the run did: each process's loss at every step it trained (losses_rank<N>.json) and, from
the main process, the metric after each epoch (metrics.json).
"""

import argparse
import os

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup, set_seed

import tiny_mrpc
from accelerate import Accelerator, DataLoaderConfiguration, DistributedType

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


def training_function(config, args):
    dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=args.use_stateful_dataloader)
    if args.with_tracking:
        accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision,
                                  dataloader_config=dataloader_config, log_with="all", project_dir=args.project_dir)
    else:
        accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision,
                                  dataloader_config=dataloader_config)

    if args.checkpointing_steps is None or args.checkpointing_steps == "epoch":
        checkpointing_steps = args.checkpointing_steps
    elif args.checkpointing_steps.isdigit():
        checkpointing_steps = int(args.checkpointing_steps)
    else:
        raise ValueError(f"--checkpointing_steps must be a number or `epoch`, not {args.checkpointing_steps!r}")

    lr, num_epochs, seed, batch_size = config["lr"], int(config["num_epochs"]), config["seed"], config["batch_size"]
    if args.with_tracking:
        accelerator.init_trackers(os.path.splitext(os.path.basename(__file__))[0], config)

    tokenizer = tiny_mrpc.tokenizer()
    datasets = tiny_mrpc.load_dataset()
    metric = tiny_mrpc.Metric()

    def tokenize_function(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)

    with accelerator.main_process_first():
        tokenized = datasets.map(tokenize_function, batched=True, remove_columns=["idx", "sentence1", "sentence2"])
    tokenized = tokenized.rename_column("label", "labels")

    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    def collate_fn(examples):
        max_length = 128 if accelerator.distributed_type == DistributedType.XLA else None
        multiple = 16 if accelerator.mixed_precision == "fp8" else 8 if accelerator.mixed_precision != "no" else None
        return tokenizer.pad(examples, padding="longest", max_length=max_length, pad_to_multiple_of=multiple,
                             return_tensors="pt")

    # No drop_last here, unlike nlp_example: the last batch of an epoch is short (or, on several processes, made
    # even with rows from the start).
    train_dataloader = DataLoader(tokenized["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size)
    eval_dataloader = DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate_fn,
                                 batch_size=EVAL_BATCH_SIZE)

    set_seed(seed)
    model = tiny_mrpc.model().to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=config["warmup_steps"],
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    overall_step, starting_epoch, resume_step = 0, 0, None
    if args.resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        accelerator.load_state(args.resume_from_checkpoint)
        # The folder's name says where it was saved: epoch_<e> after epoch e, step_<n> after n steps.
        name = os.path.basename(os.path.normpath(args.resume_from_checkpoint))
        if name.startswith("epoch_"):
            starting_epoch = int(name.removeprefix("epoch_")) + 1
        else:
            resume_step = int(name.removeprefix("step_"))
            starting_epoch = resume_step // len(train_dataloader)
            resume_step -= starting_epoch * len(train_dataloader)
            overall_step = starting_epoch * len(train_dataloader)

    losses, metrics = [], []
    for epoch in range(starting_epoch, num_epochs):
        model.train()
        total_loss = 0
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            # Mid-epoch: skip the batches the checkpoint's run had already trained on.
            if not args.use_stateful_dataloader:
                active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            else:
                active_dataloader = train_dataloader
            overall_step += resume_step
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            batch.to(accelerator.device)
            loss = model(**batch).loss / gradient_accumulation_steps
            losses.append(loss.item())
            total_loss += loss.detach().float()
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            overall_step += 1
            if isinstance(checkpointing_steps, int) and overall_step % checkpointing_steps == 0:
                accelerator.save_state(os.path.join(args.output_dir, f"step_{overall_step}"))

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
        if args.with_tracking:
            accelerator.log({"accuracy": metrics[-1]["accuracy"], "f1": metrics[-1]["f1"],
                             "train_loss": total_loss.item() / len(train_dataloader), "epoch": epoch}, step=epoch)
        if checkpointing_steps == "epoch":
            accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))
    accelerator.end_training()

    if args.record:
        tiny_mrpc.record(args.record, f"losses_rank{accelerator.process_index}.json", losses)
        if accelerator.is_main_process:
            tiny_mrpc.record(args.record, "metrics.json",
                             {"metrics": metrics, "steps": overall_step, "num_processes": accelerator.num_processes})


def main():
    parser = argparse.ArgumentParser(description="Accelerate's complete_nlp_example on a local tiny BERT and task.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--checkpointing_steps", type=str, default=None,
                        help="Save the state every n steps, or 'epoch' after each epoch.")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None,
                        help="A checkpoint folder (step_<n> or epoch_<e>) to continue from.")
    parser.add_argument("--use_stateful_dataloader", action="store_true",
                        help="Resume mid-epoch with torchdata's StatefulDataLoader.")
    parser.add_argument("--with_tracking", action="store_true", help="Log to every tracker that is installed.")
    parser.add_argument("--output_dir", type=str, default=".", help="Where the checkpoint folders go.")
    parser.add_argument("--project_dir", type=str, default="logs", help="Where the trackers write.")
    parser.add_argument("--record", type=str, default=None, help="Write per-step losses and metrics here.")
    args = parser.parse_args()
    config = {"lr": 1e-2, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup_steps": 3}
    training_function(config, args)


if __name__ == "__main__":
    main()
