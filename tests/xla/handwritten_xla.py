"""The README's hand-written loop on an XLA device, through runner.Accelerator: `python handwritten_xla.py xla OUT`
(or `cpu OUT`, the same loop on the CPU to compare). Writes OUT as JSON: the device the model and batches were on,
whether the optimizer went through torch_xla's step (xm.optimizer_step, then the graph cut), the per-step losses,
what `gather` returned, and the final weights as lists (tests/xla/lane_xla.py compares the two devices)."""

import json
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from runner import Accelerator

device, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
source, targets = torch.randn(128, 8), torch.randint(0, 3, (128,))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(source, targets), batch_size=32, shuffle=False)

accelerator = Accelerator(device=device)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
steps_through_xla = []
if accelerator.xla is not None:  # count the calls of torch_xla's optimizer step the Accelerator makes
    xm = accelerator.xla.xm
    original = xm.optimizer_step
    xm.optimizer_step = lambda *args, **kwargs: (steps_through_xla.append(1), original(*args, **kwargs))[1]
losses, batch_devices = [], set()
for epoch in range(3):
    for inputs, labels in data:
        batch_devices.add(str(inputs.device))
        loss = F.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
gathered = accelerator.gather(torch.arange(3, device=accelerator.device) + accelerator.process_index)
weights = {name: value.detach().cpu().tolist() for name, value in accelerator.unwrap_model(model).state_dict().items()}
json.dump({"device": str(accelerator.device), "parameter_device": str(next(model.parameters()).device),
           "batch_devices": sorted(batch_devices), "xla_optimizer_steps": len(steps_through_xla),
           "losses": losses, "gathered": gathered.cpu().tolist(), "weights": weights}, open(out, "w"))
