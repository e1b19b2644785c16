// Keeps tensor-sized buffers in the process instead of handing them back to
// the kernel at each free: glibc's malloc otherwise maps each block over its
// (dynamic) mmap threshold afresh and trims its heaps, so every request
// buffer of a few MiB costs a page fault per 4 KiB and a zeroing by the
// kernel. Measured on ps_bench pushpull at 1 MiB: 1.2 GB/s without, 1.6-2.4
// GB/s with (docs/BENCHMARKS.md). The price: memory freed after a peak stays
// in the process, as it does in any long-running server with a caching
// allocator.
#ifndef ASYNCPS_COMMON_LARGE_BUFFERS_H_
#define ASYNCPS_COMMON_LARGE_BUFFERS_H_

namespace asyncps {

// Call once at the start of main, before other threads exist.
void KeepLargeBuffers();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_LARGE_BUFFERS_H_
