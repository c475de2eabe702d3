"""The README's hand-written loop as a script: `python handwritten_train.py --batch-size 32 --out w.pt`, or the
same under torchrun / `python -m runner.launch hardware=multi_cpu` with --batch-size 16 per process.

Rank 0 saves the final weights and the losses (averaged over the ranks) so a test can compare the launches.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from runner import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True, help="per process")
parser.add_argument("--out", required=True)
parser.add_argument("--fail-rank", type=int, default=-1)
args = parser.parse_args()

torch.manual_seed(0)
source, targets = torch.randn(128, 8), torch.randint(0, 3, (128,))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
initial = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}  # the tests' scale
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(source, targets), batch_size=args.batch_size, shuffle=False)

accelerator = Accelerator()  # joins the process group by itself when a launcher started several processes
if accelerator.process_index == args.fail_rank:
    # Gone at once, as a crash is: a SystemExit first tears down the interpreter and the process group, which
    # under load took long enough that its peer failed on the lost connection first and the launcher ended this
    # rank with SIGTERM before its own exit code was seen (a race in the test, not in what the launcher reports).
    sys.stderr.write("failing on purpose\n")
    sys.stderr.flush()
    os._exit(3)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
losses = []
for source, targets in data:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(source), targets)
    accelerator.backward(loss)
    optimizer.step()
    losses.append(accelerator.reduce(loss.detach(), "mean").item())
if accelerator.is_main_process:
    torch.save({"weights": accelerator.unwrap_model(model).state_dict(), "initial": initial, "losses": losses,
                "processes": accelerator.num_processes}, args.out)
