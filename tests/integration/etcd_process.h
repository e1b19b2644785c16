// Test helper: a private etcd (Debian's etcd-server) with its own data
// directory and kernel-picked ports, with elections fast enough that it
// grants leases of 1 s (etcd grants none shorter than 1.5 election
// timeouts). Killed with the test, as every Subprocess.
#ifndef ASYNCPS_TESTS_INTEGRATION_ETCD_PROCESS_H_
#define ASYNCPS_TESTS_INTEGRATION_ETCD_PROCESS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/replica/etcd_coordinator.h"
#include "tests/integration/subprocess.h"

namespace asyncps::testing {

struct EtcdProcess {
  std::unique_ptr<Subprocess> process;
  std::string endpoint;  // "127.0.0.1:<client port>"
  EtcdTls tls;           // What a client needs to reach it (off: none).
};

// Starts etcd in TEST_TMPDIR/<name> and waits until it answers; its client
// port is `client_port` (0: one the kernel picks). With `certs` (a
// deploy/gen_certs.sh directory, tests/testing/certs.h) its client port
// is TLS with server.pem and asks clients for a certificate the CA
// signed (--client-cert-auth); `tls` then holds client.pem's.
absl::StatusOr<EtcdProcess> StartEtcd(const std::string& name,
                                      int client_port = 0,
                                      const std::string& certs = "");

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_ETCD_PROCESS_H_
