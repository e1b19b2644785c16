#include "tests/integration/etcd_process.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/replica/etcd_coordinator.h"
#include "tests/testing/certs.h"

namespace asyncps::testing {

absl::StatusOr<EtcdProcess> StartEtcd(const std::string& name, int client_port,
                                      const std::string& certs) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  const std::string scheme = certs.empty() ? "http://" : "https://";
  const std::string client = absl::StrCat(
      scheme, "127.0.0.1:", client_port != 0 ? client_port : FreePort());
  const std::string peer = absl::StrCat("http://127.0.0.1:", FreePort());
  EtcdProcess etcd;
  etcd.endpoint = client.substr(scheme.size());
  std::vector<std::string> tls_flags;
  if (!certs.empty()) {
    tls_flags = {"--cert-file=" + certs + "/server.pem",
                 "--key-file=" + certs + "/server.key",
                 "--trusted-ca-file=" + certs + "/ca.pem",
                 "--client-cert-auth"};
    Security client = LoadCerts(certs, "client");
    etcd.tls = EtcdTls{client.ca_pem, client.cert_pem, client.key_pem};
  }
  std::vector<std::string> argv = {
      "/usr/bin/etcd",
      "--name=test",
      "--data-dir=" + dir,
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=test=" + peer,
      "--heartbeat-interval=50",
      "--election-timeout=500",
      "--log-level=warn",
  };
  argv.insert(argv.end(), tls_flags.begin(), tls_flags.end());
  auto started = Subprocess::Start(argv);
  if (!started.ok()) return started.status();
  etcd.process = *std::move(started);
  // Ready once it answers a read (NOT_FOUND: there is nothing yet). A new
  // channel each time: one that failed to connect backs off for seconds.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::Status s =
        EtcdCoordinator(etcd.endpoint, absl::Milliseconds(500), etcd.tls)
            .Get("/ready")
            .status();
    if (s.ok() || absl::IsNotFound(s)) return etcd;
    if (absl::Now() > until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "etcd at ", etcd.endpoint, " never answered: ", s.message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace asyncps::testing
