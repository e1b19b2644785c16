"""asyncps: train through asyncps parameter servers from Python.

    import asyncps
    with asyncps.Client(["localhost:5000", "localhost:5001"], rank=0,
                        num_workers=2, mode="async") as client:
        client.declare({"w": w, "b": b}, optimizer="sgd", lr=0.1)
        for step in range(100):
            weights = client.pull()            # {name: numpy array}
            grads = compute(weights)           # your framework
            client.push(grads)                 # {name: gradient}
            client.end_step()

Arrays are float32 and C-contiguous and cross without a copy; the GIL is
released while a call waits on the network. Errors: ValueError (bad input:
a wrong shape or dtype, NaN, a non-contiguous array), KeyError (an unknown
tensor), ConnectionError (a server gone, or the rank held by another live
worker, past retry_for), PermissionError (refused identity or token),
RuntimeError (anything else: the message is
the server's). A refused call changes no weight.

bsp and a shard restart: when a shard loses this rank's part of a step
(its gradients, or end_step's marks for the tensors it did not push), the
pull of that step sends it again from a copy the client keeps until the
next step's push, and pulls again (up to three times); push_pull and
asyncps.torch.DistributedOptimizer do the same.

asyncps.torch.DistributedOptimizer turns a PyTorch training loop into an
asyncps worker; `python3 -m asyncps.run` starts shards and workers.
"""

import os

from asyncps import _core

__all__ = ["Client", "__version__"]
__version__ = "0.5.0"


class Client(_core.Client):
    """One worker of an asyncps job (see the module's doc).

    Every argument may be left out under the launcher (`python3 -m
    asyncps.run`): servers, rank and num_workers come from ASYNCPS_SERVERS,
    ASYNCPS_RANK and ASYNCPS_NUM_WORKERS, and the mode is the servers' own
    (a mode given that is not theirs is refused, naming both).
    """

    def __init__(self, servers=None, rank=None, num_workers=None, mode=None,
                 **options):
        env = os.environ
        if servers is None:
            servers = env.get("ASYNCPS_SERVERS")
            if not servers:
                raise ValueError(
                    "no servers: pass servers= or run under python3 -m "
                    "asyncps.run (which sets ASYNCPS_SERVERS)")
        if rank is None:
            rank = int(env.get("ASYNCPS_RANK", -1))
        if num_workers is None:
            num_workers = int(env.get("ASYNCPS_NUM_WORKERS", 1))
        if mode is None:
            mode = env.get("ASYNCPS_MODE", "")  # "": the servers' mode.
        super().__init__(servers, rank, num_workers, mode, **options)
