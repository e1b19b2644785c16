import sys

import numpy as np
import torch
import torch.nn.functional as F

import asyncps
import asyncps.torch

# Shards started with: ps_server --shard=I --num_shards=2 --port=500I
servers = sys.argv[1] if len(sys.argv) > 1 else "localhost:5000,localhost:5001"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 2))
client = asyncps.Client(servers, rank=0, num_workers=1, mode="async")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt = asyncps.torch.DistributedOptimizer(
    opt, client, named_parameters=model.named_parameters())
x = torch.randn(256, 4)
y = (x[:, 0] > 0).long()  # Learn the sign of the first feature.
for step in range(200):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()  # Pushes the gradients; the servers' new weights are in model.
accuracy = (model(x).argmax(1) == y).float().mean().item()
print(f"loss {loss.item():.3f} accuracy {accuracy:.2f}")
opt.close()
