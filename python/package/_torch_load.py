"""asyncps.torch.load_state_dict: a model's parameters (and buffers) from
the weights the servers hold, through a reader's client.
"""

import torch


def load_state_dict(model, servers, strict=True):
    """Fills `model`'s parameters (named as its named_parameters(), as
    DistributedOptimizer declares them) with the weights the servers hold
    now; `servers` is "host:port,..." or a list. With `strict`, a parameter
    the servers do not hold is a KeyError naming it."""
    import asyncps
    reader = asyncps.Client(servers, reader=True)
    try:
        reader.attach()
        held = reader.tensors
        missing = [n for n, _ in model.named_parameters() if n not in held]
        if strict and missing:
            raise KeyError(f"the servers hold no tensor {missing}")
        # Floating-point buffers too, where the servers keep them.
        tensors = dict(model.named_parameters())
        tensors.update((n, b) for n, b in model.named_buffers()
                       if b.is_floating_point())
        weights = reader.pull([n for n in tensors if n in held])
    finally:
        reader.leave()
    with torch.no_grad():
        for name, t in tensors.items():
            if name in weights:
                t.copy_(torch.from_numpy(weights[name]).reshape(t.shape))
    return model
