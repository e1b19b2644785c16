// A secured cluster for real: certificates from deploy/gen_certs.sh, a
// shard with mutual TLS and a token, a worker that trains through it (its
// tensors over the TLS data plane), and clients that are turned away on
// either transport: without a certificate, with another CA's, in plaintext
// (UNAVAILABLE: no handshake), with a wrong token (UNAUTHENTICATED). The
// weights do not change for any of them.
#include "common/security.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/certs.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

std::vector<std::string> Flags(const std::string& dir, const std::string& who,
                               bool token = true) {
  std::vector<std::string> f = {
      absl::StrCat("--tls_cert=", dir, "/", who, ".pem"),
      absl::StrCat("--tls_key=", dir, "/", who, ".key"),
      absl::StrCat("--tls_ca=", dir, "/ca.pem")};
  if (token) f.push_back(absl::StrCat("--auth_token_file=", dir, "/token"));
  return f;
}

// A client of `cluster` with these files (empty: not given), its tensors
// over `transport`.
std::unique_ptr<PsClient> Client(const TestCluster& cluster,
                                 const SecurityFlags& files,
                                 Transport transport = Transport::kTcp) {
  auto security = LoadSecurity(files);
  EXPECT_TRUE(security.ok()) << security.status();
  PsClientOptions options;
  options.servers = cluster.servers();
  options.transport = transport;
  options.security = *security;
  options.rpc_timeout = absl::Seconds(5);
  options.retry_for = absl::Seconds(1);
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

// Every weight of the model `client` uses, pulled from slices `all`.
std::vector<std::vector<float>> AllWeights(PsClient* client,
                                           const std::vector<int>& all) {
  std::vector<std::vector<float>> w;
  for (const auto& t : client->spec().tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape()) n *= d;
    w.emplace_back(n);
  }
  std::vector<SliceVersion> versions;
  EXPECT_TRUE(client->Pull(all, &w, &versions, -1, 0).ok());
  return w;
}

// A client that must be refused: its files and the code it gets.
struct Intruder {
  const char* what;
  SecurityFlags files;
  absl::StatusCode code;
};

// Each way a client can differ from the job's `good` files: no
// certificate, one from `other` (another CA's directory), plaintext, a
// wrong token, no token.
std::vector<Intruder> Intruders(const SecurityFlags& good,
                                const std::string& other) {
  SecurityFlags no_cert = good;
  no_cert.tls_cert = no_cert.tls_key = "";
  SecurityFlags other_ca = good;
  other_ca.tls_cert = other + "/client.pem";
  other_ca.tls_key = other + "/client.key";
  SecurityFlags plaintext;
  plaintext.auth_token_file = good.auth_token_file;
  SecurityFlags wrong_token = good;
  wrong_token.auth_token_file = other + "/token";
  SecurityFlags no_token = good;
  no_token.auth_token_file = "";
  return {
      {"no client certificate", no_cert, absl::StatusCode::kUnavailable},
      {"another CA's certificate", other_ca, absl::StatusCode::kUnavailable},
      {"plaintext", plaintext, absl::StatusCode::kUnavailable},
      {"a wrong token", wrong_token, absl::StatusCode::kUnauthenticated},
      {"no token", no_token, absl::StatusCode::kUnauthenticated}};
}

TEST(Security, MutualTlsAndATokenLetTheJobInAndNoOneElse) {
  const std::string certs = MakeCerts("certs");
  const std::string other = MakeCerts("other");  // Another CA.
  auto cluster = TestCluster::Start(1, Flags(certs, "server"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  std::vector<std::string> worker_flags = Flags(certs, "client");
  worker_flags.push_back("--steps=30");
  auto worker = StartWorker(**cluster, 0, 1, worker_flags);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto done = Finish(**worker);
  ASSERT_TRUE(done.ok()) << done.status();

  SecurityFlags good;
  good.tls_cert = certs + "/client.pem";
  good.tls_key = certs + "/client.key";
  good.tls_ca = certs + "/ca.pem";
  good.auth_token_file = certs + "/token";
  auto trusted = Client(**cluster, good);
  ASSERT_TRUE(trusted->FetchModel().ok());
  const std::vector<int> all = {0, 1, 2, 3, 4, 5};
  auto weights = [&] { return AllWeights(trusted.get(), all); };
  const auto before = weights();

  for (const Intruder& c : Intruders(good, other)) {
    for (Transport transport : {Transport::kTcp, Transport::kGrpc}) {
      auto intruder = Client(**cluster, c.files, transport);
      ASSERT_TRUE(intruder->UseModel(trusted->spec()).ok());
      auto stats = AdminClient(intruder->caller()).StatsAll();
      EXPECT_EQ(stats.status().code(), c.code)
          << c.what << ": " << stats.status();
      std::vector<std::vector<float>> grads = before;
      for (auto& g : grads) std::fill(g.begin(), g.end(), 1.0f);
      std::vector<SliceVersion> versions(trusted->partition().slices().size());
      absl::Status pushed =
          intruder->Push(all, grads, versions, -1, 0, nullptr);
      EXPECT_EQ(pushed.code(), c.code) << c.what << ": " << pushed;
    }
  }
  EXPECT_EQ(weights(), before) << "a refused client changed the weights";

  // psctl with the job's files sees the shard; without a token it is
  // refused.
  std::vector<std::string> argv = {
      RunfilePath("tools/psctl"),
      absl::StrCat("--servers=", (*cluster)->ServerList()), "--timeout=5s"};
  for (const auto& f : Flags(certs, "client")) argv.push_back(f);
  argv.push_back("stats");
  auto psctl = Subprocess::Start(argv);
  ASSERT_TRUE(psctl.ok());
  EXPECT_TRUE((*psctl)->WaitForLine("updates_applied", absl::Seconds(30)).ok());
  EXPECT_EQ(ExitCode(**psctl), 0);
}

TEST(Security, BadSecurityFlagsStopTheStart) {
  const std::string certs = MakeCerts("flags");
  const std::string short_token = certs + "/short-token";
  ASSERT_TRUE(WriteFile(short_token, "abc\n"));
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--tls_cert=" + certs + "/server.pem"},
        std::vector<std::string>{"--tls_ca=" + certs + "/ca.pem"},
        std::vector<std::string>{"--tls_cert=/nonexistent.pem",
                                 "--tls_key=/nonexistent.key"},
        std::vector<std::string>{"--auth_token_file=" + short_token}}) {
    std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                     "--host=127.0.0.1", "--port=0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto server = Subprocess::Start(argv);
    ASSERT_TRUE(server.ok());
    EXPECT_EQ(ExitCode(**server, absl::Seconds(30)), 2) << flags[0];
  }
}

}  // namespace
}  // namespace asyncps::testing
