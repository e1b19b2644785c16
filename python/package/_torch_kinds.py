"""The torch.optim optimizers that asyncps.torch.DistributedOptimizer wraps,
seen as the servers' optimizer kinds: which kind an instance is, a param
group's hyper-parameters and a parameter's state in the servers' names and
back, and the optimizer that the first API's keyword arguments meant.

Pure functions of torch objects: nothing here talks to a server.
"""

import torch

SUPPORTED = "torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, " \
    "torch.optim.Adagrad"


def kind_of(optimizer):
    """The servers' optimizer kind for a torch.optim instance, or
    ValueError naming what is supported."""
    groups = optimizer.param_groups
    for group in groups:
        if group.get("maximize") or group.get("amsgrad"):
            raise ValueError(
                "asyncps.torch.DistributedOptimizer: maximize and amsgrad "
                "are not supported")
    if isinstance(optimizer, torch.optim.SGD):
        return ("momentum" if any(g["momentum"] != 0 for g in groups)
                else "sgd")
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adam"
    if isinstance(optimizer, torch.optim.Adagrad):
        return "adagrad"
    raise ValueError(
        f"asyncps.torch.DistributedOptimizer wraps {SUPPORTED}; not "
        f"{type(optimizer).__module__}.{type(optimizer).__name__}")


def hyper(kind, group):
    """One param group's hyper-parameters, as the servers name them."""
    h = {"lr": float(group["lr"]),
         "weight_decay": float(group.get("weight_decay", 0.0))}
    if kind == "momentum":
        momentum = float(group["momentum"])
        h.update(momentum=momentum, nesterov=bool(group["nesterov"]),
                 # Without momentum PyTorch keeps no buffer: v = g each time.
                 dampening=float(group["dampening"]) if momentum else 0.0)
    elif kind in ("adam", "adamw"):
        beta1, beta2 = group["betas"]
        h.update(beta1=float(beta1), beta2=float(beta2),
                 eps=float(group["eps"]))
    elif kind == "adagrad":
        h.update(eps=float(group["eps"]), lr_decay=float(group["lr_decay"]),
                 initial_accumulator_value=float(
                     group["initial_accumulator_value"]))
    return h


def from_module(model, kind, lr, options):
    """The first API's form, DistributedOptimizer(model, client,
    kind="sgd", lr=..., **options): the torch.optim optimizer it meant."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no parameter to train")
    wd = options.get("weight_decay", 0.0)
    if kind in ("sgd", "momentum"):
        return torch.optim.SGD(
            params, lr=lr, weight_decay=wd,
            momentum=options.get("momentum", 0.9) if kind == "momentum"
            else 0,
            nesterov=options.get("nesterov", False))
    if kind == "adam":
        return torch.optim.Adam(
            params, lr=lr, weight_decay=wd, eps=options.get("eps", 1e-8),
            betas=(options.get("beta1", 0.9), options.get("beta2", 0.999)))
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=wd,
                                   eps=options.get("eps", 1e-10))
    raise ValueError(f"optimizer '{kind}' (want sgd, momentum, adam, adagrad)")


def current_form(optimizer, named_parameters, named_buffers, legacy):
    """(optimizer, named_parameters, named_buffers) as the current API has
    them. The first API, DistributedOptimizer(model, client, lr=...,
    kind="momentum", momentum=...), becomes the torch.optim optimizer it
    meant over the model's parameters and buffers; otherwise a keyword
    argument left over (in `legacy`) is a TypeError."""
    if isinstance(optimizer, torch.nn.Module):
        module = optimizer
        optimizer = from_module(module, legacy.pop("kind", "sgd"),
                                legacy.pop("lr", 0.01), legacy)
        return optimizer, module.named_parameters(), module.named_buffers()
    if legacy:
        raise TypeError(f"unexpected arguments {sorted(legacy)}")
    return optimizer, named_parameters, named_buffers


def torch_state(kind, held):
    """One parameter's state in the wrapped class's own format, from the
    servers' (pull_state's "slot1", "slot2", "steps"); None where PyTorch
    keeps no state (before a first update, Adagrad aside)."""
    t = {k: torch.from_numpy(held[k]) for k in ("slot1", "slot2")
         if held[k] is not None}
    steps = int(held["steps"])
    if kind == "adagrad":
        return {"step": torch.tensor(float(steps)), "sum": t["slot1"]}
    if steps == 0:
        return None
    if kind == "sgd":
        return {"momentum_buffer": None}
    if kind == "momentum":
        return {"momentum_buffer": t["slot1"]}
    return {"step": torch.tensor(float(steps)), "exp_avg": t["slot1"],
            "exp_avg_sq": t["slot2"]}


def server_state(kind, state):
    """One parameter's state from the wrapped class's format, as the
    servers' load_state takes it; None where there is nothing to send
    (plain SGD, or momentum without a buffer yet)."""

    def host(t):
        return t.detach().to("cpu", torch.float32).contiguous().numpy()

    if kind == "momentum":
        if state.get("momentum_buffer") is None:
            return None
        return {"slot1": host(state["momentum_buffer"]), "steps": 1}
    if kind in ("adam", "adamw"):
        return {"slot1": host(state["exp_avg"]),
                "slot2": host(state["exp_avg_sq"]),
                "steps": int(float(state["step"]))}
    if kind == "adagrad":
        return {"slot1": host(state["sum"]), "steps": int(float(state["step"]))}
    return None
