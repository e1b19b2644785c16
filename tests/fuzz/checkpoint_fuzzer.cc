// libFuzzer target: bytes as a checkpoint file, read as a shard does at
// start. Any input must give a checkpoint or an error, never a crash, a
// hang or a huge allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/testing/fault_file_system.h"
#include "server/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  asyncps::testing::FaultFileSystem fs;
  fs.WriteFileForTest("/ckpt/shard-0-1.ckpt",
                      std::string(reinterpret_cast<const char*>(data), size));
  auto read = asyncps::ReadCheckpointFile(&fs, "/ckpt/shard-0-1.ckpt");
  if (read.ok()) {
    // What a shard does next with it: restore a store.
    asyncps::ShardStore store(0, 1, 1 << 20);
    (void)store.Restore(*read);
  }
  return 0;
}
