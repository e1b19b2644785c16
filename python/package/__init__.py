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
tensor), ConnectionError (a server gone past retry_for), PermissionError
(refused identity or token), RuntimeError (anything else: the message is
the server's). A refused call changes no weight.

asyncps.torch.DistributedOptimizer turns a PyTorch training loop into an
asyncps worker.
"""

from asyncps._core import Client

__all__ = ["Client"]
