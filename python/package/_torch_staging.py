"""The float32 CPU tensors through which DistributedOptimizer's client reads
and writes a model's parameters, their gradients and its buffers.
"""

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class HostTensors:
    """By name, the float32 CPU tensor the client reads and writes for each
    parameter and buffer: the tensor itself where it is a contiguous float32
    CPU tensor, else a staging copy, an f32 master copy in host memory as the
    servers keep (pinned for a GPU: one copy each way per step). A staged
    parameter's gradient has a staging copy too.

    Not thread-safe: the optimizer's thread uses it.
    """

    def __init__(self):
        self.host = {}  # name -> the float32 CPU tensor.
        self._grad_host = {}  # name -> a staged parameter's gradient copy.
        self._params = {}  # name -> a staged parameter.
        self._buffers = {}  # name -> a staged buffer.

    def add_parameter(self, name, p):
        """Stages parameter `p` with its current weights; ValueError naming
        it (`name`) unless it is float32, bfloat16 or float16 on the CPU or
        a CUDA device."""
        if p.dtype not in DTYPES or p.device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"parameter '{name}': asyncps trains float32, "
                f"bfloat16 and float16 tensors on the CPU or a CUDA "
                f"device, not {p.dtype} on {p.device}")
        if (p.dtype == torch.float32 and p.device.type == "cpu"
                and p.is_contiguous()):
            self.host[name] = p.detach()  # The parameter itself.
            return
        pin = p.device.type == "cuda"
        self.host[name] = torch.empty(
            p.shape, dtype=torch.float32, pin_memory=pin)
        self.host[name].copy_(p.detach())
        self._grad_host[name] = torch.empty(
            p.shape, dtype=torch.float32, pin_memory=pin)
        self._params[name] = p

    def add_buffer(self, name, b):
        """Stages floating-point buffer `b` with its current values."""
        if (b.dtype == torch.float32 and b.device.type == "cpu"
                and b.is_contiguous()):
            self.host[name] = b  # Updated in place by the model.
            return
        self.host[name] = b.detach().to("cpu", torch.float32)
        self._buffers[name] = b

    def arrays(self, names=None):
        """name -> numpy view of the host tensor, for `names` or all."""
        return {n: self.host[n].numpy()
                for n in (self.host if names is None else names)}

    def gradient(self, name, p):
        """`p`'s gradient as a float32 array the client reads. A CUDA
        parameter's copy is started, not waited for: torch.cuda.synchronize()
        before reading it."""
        if name in self._grad_host:
            staged = self._grad_host[name]
            staged.copy_(p.grad.detach(), non_blocking=p.is_cuda)
            return staged.numpy()
        return p.grad.detach().contiguous().numpy()

    def buffers_to_host(self):
        """The model's current buffer values where they are staged."""
        with torch.no_grad():
            for n, b in self._buffers.items():
                self.host[n].copy_(b)

    def to_model(self):
        """Staged weights (GPU, bf16/f16 parameters, and buffers) into the
        model."""
        cuda = False
        with torch.no_grad():
            for n, p in self._params.items():
                p.copy_(self.host[n], non_blocking=p.is_cuda)
                cuda |= p.is_cuda
            for n, b in self._buffers.items():
                b.copy_(self.host[n], non_blocking=b.is_cuda)
                cuda |= b.is_cuda
        if cuda:
            torch.cuda.synchronize()
