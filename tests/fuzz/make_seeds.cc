// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/):
// valid inputs for each, from which libFuzzer mutates. Run once by hand
// when a format changes:
//   bazel run //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus
#include <fstream>
#include <string>

#include "common/file_system.h"
#include "server/checkpoint.h"
#include "server/shard_store.h"
#include "tests/server/small_model.h"

namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Op(char op, const google::protobuf::Message& m) {
  return std::string(1, op) + m.SerializeAsString();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  using asyncps::testing::SmallModel;
  using asyncps::testing::SmallModelKey;
  using asyncps::testing::SmallModelPush;

  asyncps::ShardStore store(0, 1, 1 << 20);
  if (!store.Declare(SmallModel()).ok()) return 1;
  asyncps::v1::PushResponse pushed;
  if (!store.Push(SmallModelPush(0.5f), &pushed).ok()) return 1;
  auto snapshot = store.Snapshot();
  if (!snapshot.ok()) return 1;
  if (!asyncps::WriteCheckpointFile(asyncps::FileSystem::Default(),
                                    dir + "/checkpoint/small.ckpt", *snapshot)
           .ok()) {
    return 1;
  }

  // Two 2x2 images (magic 0x803) and their labels (0x801); the first byte
  // puts the split after the 24-byte images file.
  const std::string images(
      "\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02"
      "\x00\x00\x00\x02\x00\x40\x80\xff\x10\x20\x30\x40",
      24);
  const std::string labels("\x00\x00\x08\x01\x00\x00\x00\x02\x03\x09", 10);
  Write(dir + "/idx/pair", std::string(1, 6) + images + labels);

  asyncps::v1::PullRequest pull;
  *pull.add_slices() = SmallModelKey();
  asyncps::v1::AssignRequest assign;
  *assign.add_weights() = SmallModelPush(1.0f).gradients(0);
  asyncps::v1::RegisterRequest join;
  join.set_rank(-1);
  join.set_num_workers(2);
  asyncps::v1::PushPullRequest push_pull;
  *push_pull.mutable_push() = SmallModelPush(0.25f, 0, 0, 1);
  Write(dir + "/request/declare", Op(0, SmallModel()));
  Write(dir + "/request/push", Op(1, SmallModelPush(0.5f)));
  Write(dir + "/request/pull", Op(2, pull));
  Write(dir + "/request/assign", Op(3, assign));
  Write(dir + "/request/register", Op(4, join));
  Write(dir + "/request/push_pull_ssp", Op(5 + 6, push_pull));
  Write(dir + "/request/push_pull_bsp", Op(5 + 12, push_pull));
  return 0;
}
