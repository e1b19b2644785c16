"""nvcc through Bazel: compiles .cu files to objects for a cc_library.

Bazel 4 has no CUDA rules and Debian ships none, so a genrule runs the
toolkit's nvcc (/usr/local/cuda) and the objects go into a cc_library's srcs.
Kernels are built for sm_80 (A100) and sm_90 (H100/H200), plus PTX for
newer GPUs to JIT.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

CUDA_ARCH_FLAGS = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
])

def cuda_objects(name, srcs, hdrs = []):
    """One genrule per .cu file; returns the list of object labels."""
    outs = []
    for src in srcs:
        obj = src.replace(".cu", ".o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = (NVCC + " -O3 -std=c++17 -Xcompiler -fPIC " + CUDA_ARCH_FLAGS +
                   " -I. -c $(location " + src + ") -o $@"),
        )
        outs.append(obj)
    return outs
