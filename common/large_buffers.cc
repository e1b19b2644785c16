#include "common/large_buffers.h"

#include <malloc.h>

namespace asyncps {

void KeepLargeBuffers() {
  // Blocks up to 32 MiB (the most glibc allows here) come from the heap and
  // are reused; the heap is trimmed only when 1 GiB is free at its top.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace asyncps
