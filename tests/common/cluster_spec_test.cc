#include "common/cluster_spec.h"

#include "gtest/gtest.h"

namespace asyncps {
namespace {

TEST(ClusterSpec, ParsesHostsAndPorts) {
  auto list = ParseServerList("127.0.0.1:5000, localhost:5001,[::1]:6000");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].host, "127.0.0.1");
  EXPECT_EQ((*list)[0].port, 5000);
  EXPECT_EQ((*list)[1].ToString(), "localhost:5001");
  EXPECT_EQ((*list)[2].host, "::1");
  EXPECT_EQ((*list)[2].ToString(), "[::1]:6000");
}

TEST(ClusterSpec, RejectsBadEntriesByName) {
  for (const char* bad : {"", "127.0.0.1", "h:0", "h:70000", "h:x", ":5",
                          "a:1,,b:2", "a:1,a:1", "::1:5"}) {
    auto list = ParseServerList(bad);
    EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseServerList("a:1,b:99999").status().message().find("b:99999"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace asyncps
