// Bad flags reach the configs' checks from the command line: each binary
// refuses them at start, with a message naming the flag, before touching the
// network. Every bad value is tested in-process (shard_server_test,
// worker_config_test); these are the few that show the wiring.
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

// ps_server with `flags` says `says` and exits with status 2.
void ExpectServerRefuses(const std::string& flags, const std::string& says) {
  auto p = Subprocess::Start(
      {"/bin/bash", "-c",
       absl::StrCat(RunfilePath("server/ps_server"),
                    " --host=127.0.0.1 --port=0 ", flags, " 2>&1")});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE((*p)->WaitForLine(says, absl::Seconds(30)).ok()) << flags;
  EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 2) << flags;
}

TEST(Flags, ServerRefusesBadFlags) {
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--shard=2", "--num_shards=2"},
        {"--mode=eventual"},
        {"--stale_policy=drop:-1"}}) {
    std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                     "--host=127.0.0.1", "--port=0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Subprocess::Start(argv);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 2) << flags[0];
  }
}

// A replicated group's flags (issue #40): --min_insync within the group,
// and the members' own credential wherever the job has one. Each a clear
// message naming the flag, and exit status 2.
TEST(Flags, ServerRefusesBadGroupFlags) {
  const std::string token = TempPath("token"), other = TempPath("member");
  ASSERT_TRUE(WriteFile(token, "a-token-of-the-workers-0123456789"));
  ASSERT_TRUE(WriteFile(other, "a-token-of-the-members-0123456789"));
  const std::string group = "--replicas=2 --etcd=127.0.0.1:1 --port=1 ";
  for (const auto& [flags, says] :
       std::vector<std::pair<std::string, std::string>>{
           {group + "--min_insync=3", "--min_insync=3 must be in [1, --re"},
           {group + "--join_backlog_bytes=-1", "--join_backlog_bytes must be"},
           {"--min_insync=2", "--min_insync needs --replicas"},
           {group + "--auth_token_file=" + token, "needs --member_token_file"},
           {"--member_token_file=" + other, "--member_token_file needs --rep"},
           {group + "--auth_token_file=" + token +
                " --member_token_file=" + token,
            "the members' credential must be apart"}}) {
    ExpectServerRefuses(flags, says);
  }
}

// --stale_policy=dc (DC-ASGD, issue #42): a bad lambda or window, a mode
// with no delay to compensate, or a replicated group (not built yet).
TEST(Flags, ServerRefusesBadDelayCompensation) {
  for (const auto& [flags, says] :
       std::vector<std::pair<std::string, std::string>>{
           {"--stale_policy=dc:-0.5", "LAMBDA a number >= 0"},
           {"--stale_policy=dc:nan", "LAMBDA a number >= 0"},
           {"--stale_policy=dc:0.1:0", "from 1 to 1024"},
           {"--stale_policy=dc:0.1:2:3", "dc:LAMBDA or dc:LAMBDA:WINDOW"},
           {"--stale_policy=dc:0.1 --mode=bsp", "no delay to compensate"},
           {"--stale_policy=dc:0.1 --mode=allreduce", "keeps no weights"},
           {"--stale_policy=dc:0.1 --replicas=2 --etcd=127.0.0.1:1 --port=1",
            "with --replicas is not built yet"}}) {
    ExpectServerRefuses(flags, says);
  }
}

// Start-up errors that only show against the machine: each a clear
// message and exit status 2.
TEST(Flags, ServerRefusesAnUnusableCheckpointDirectory) {
  const std::string file = TempPath("a-file");
  ASSERT_TRUE(WriteFile(file, "not a directory"));
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--checkpoint_dir=" + file},
        {"--checkpoint_dir=/nonexistent/dir"},
        {"--checkpoint_dir=" + TempPath(""), "--checkpoint_every=-5s"}}) {
    std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                     "--host=127.0.0.1", "--port=0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Subprocess::Start(argv);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 2) << flags.back();
  }
}

// --version names the release; --help lists the binary's own flags and the
// security flags every binary shares (TLS, the token).
TEST(Flags, EveryBinaryHasAVersionAndFullHelp) {
  for (const std::string binary :
       {"server/ps_server", "worker/ps_worker", "tools/psctl"}) {
    auto version = Subprocess::Start({RunfilePath(binary), "--version"});
    ASSERT_TRUE(version.ok());
    auto line = (*version)->WaitForLine("asyncps", absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << binary << ": " << line.status();
    EXPECT_NE(line->find("(asyncps 0.5.0, commit "), std::string::npos)
        << *line;
    // The commit Bazel stamped: 12 hex digits (maybe "-dirty"), or
    // "unknown" outside a checkout, never empty.
    EXPECT_EQ(line->find("commit )"), std::string::npos) << *line;
    EXPECT_EQ(ExitCode(**version, absl::Seconds(30)), 0) << binary;
    auto help = Subprocess::Start({RunfilePath(binary), "--help"});
    ASSERT_TRUE(help.ok());
    // Read through the security flags (--help lists them by file).
    auto listed = (*help)->WaitForLine("--tls_key", absl::Seconds(30));
    EXPECT_TRUE(listed.ok()) << binary << " --help lacks --tls_key";
    EXPECT_NE((*help)->output().find("--admin_token_file"), std::string::npos)
        << binary;
    EXPECT_NE((*help)->output().find("--auth_token_file"), std::string::npos)
        << binary;
    EXPECT_NE((*help)->output().find("Flags from"), std::string::npos);
    ExitCode(**help, absl::Seconds(30));
  }
}

TEST(Flags, ServerWritesItsReadyFileOrStops) {
  const std::string ready = TempPath("ready.json");
  std::filesystem::remove(ready);
  auto p = Subprocess::Start({RunfilePath("server/ps_server"),
                              "--host=127.0.0.1", "--port=0", "--shard=1",
                              "--num_shards=2", "--ready_file=" + ready});
  ASSERT_TRUE(p.ok());
  auto line = (*p)->WaitForLine("listening on", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  // The file is in place (renamed whole) before the line is printed.
  const std::string json = ReadFile(ready).value_or("");
  EXPECT_NE(json.find("\"shard\": 1, \"num_shards\": 2"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"port\": " + line->substr(line->rfind(':') + 1)),
            std::string::npos)
      << json << " / " << *line;
  (*p)->Signal(SIGKILL);
  (*p)->Wait(absl::Seconds(30));
  // A ready file it cannot write: it stops, status 1, naming the flag.
  auto bad = Subprocess::Start({RunfilePath("server/ps_server"),
                                "--host=127.0.0.1", "--port=0",
                                "--ready_file=/nonexistent/dir/ready.json"});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(ExitCode(**bad, absl::Seconds(30)), 1);
}

TEST(Flags, WorkerRefusesAnEmptyTrainingSet) {
  // Valid IDX files holding zero 28x28 images and zero labels.
  const std::string dir = FreshTempDir("empty");
  const std::string images =
      std::string("\0\0\x08\x03", 4) + std::string("\0\0\0\0", 4) +
      std::string("\0\0\0\x1c", 4) + std::string("\0\0\0\x1c", 4);
  const std::string labels =
      std::string("\0\0\x08\x01", 4) + std::string("\0\0\0\0", 4);
  for (const auto& [name, bytes] :
       {std::pair<std::string, std::string>{"train-images-idx3-ubyte", images},
        {"train-labels-idx1-ubyte", labels}}) {
    ASSERT_TRUE(WriteGzFile(dir + "/" + name + ".gz", bytes));
  }
  auto p = Subprocess::Start({RunfilePath("worker/ps_worker"),
                              "--servers=127.0.0.1:1", "--data_dir=" + dir});
  ASSERT_TRUE(p.ok());
  auto line = (*p)->WaitForLine("failed:", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NE(line->find("nothing to train on"), std::string::npos) << *line;
  EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 2);
}

TEST(Flags, WorkerRefusesBadFlagsNamingThem) {
  struct Case {
    std::string flag, words;
  };
  for (const Case& c : std::vector<Case>{{"--mode=eventual", "--mode=eventual"},
                                         {"--lr=-1", "learning_rate"},
                                         {"--rank=-2", "--rank=-2"},
                                         {"--eval_every=0", "--eval_every"}}) {
    auto p =
        Subprocess::Start({RunfilePath("worker/ps_worker"),
                           "--servers=127.0.0.1:1", "--num_workers=2", c.flag});
    ASSERT_TRUE(p.ok());
    auto line = (*p)->WaitForLine("failed:", absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << c.flag << ": " << line.status();
    EXPECT_NE(line->find(c.words), std::string::npos) << *line;
    EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 2) << c.flag;
  }
}

TEST(Flags, WorkerGivesUpOnUnreachableServersNamingThem) {
  // Port 1 on 127.0.0.1: nothing listens there.
  auto p = Subprocess::Start({RunfilePath("worker/ps_worker"),
                              "--servers=127.0.0.1:1", "--retry_for=1s"});
  ASSERT_TRUE(p.ok());
  auto line = (*p)->WaitForLine("failed:", absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NE(line->find("UNAVAILABLE: giving up after 1s"), std::string::npos)
      << *line;
  EXPECT_NE(line->find("shard 0 at 127.0.0.1:1"), std::string::npos) << *line;
  EXPECT_EQ(ExitCode(**p, absl::Seconds(30)), 1);
}

}  // namespace
}  // namespace asyncps::testing
