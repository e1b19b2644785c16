// Prometheus' /metrics over HTTP for one process: GET /metrics answers the
// text exposition format of every registered prometheus::Collectable
// (prometheus-cpp builds and serializes the families; cpp-httplib serves
// them on threads of its own), and the process's own metrics
// (common/process_metrics.h: process_*, asyncps_build_info). Thread-safe.
//
// prometheus-cpp's own Exposer is not used: Debian's civetweb starts its
// threads with 100 KiB stacks, and glibc carves a thread's static TLS out of
// that stack. In a worker, OpenBLAS (60 KiB of TLS) and glog (30 KiB) leave
// too little, and the first scrape overflows it (SIGSEGV in civetweb's
// snprintf). cpp-httplib's threads have the default 8 MiB stack.
#ifndef ASYNCPS_COMMON_METRICS_ENDPOINT_H_
#define ASYNCPS_COMMON_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/process_metrics.h"
#include "prometheus/collectable.h"

namespace httplib {
class Server;
}

namespace asyncps {

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0: one the kernel picks). Fails with
  // INVALID_ARGUMENT naming `flag` when the port is out of range, busy or
  // not ours to bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& host, int port, const std::string& flag);

  // Stops serving; a scrape in progress finishes first.
  ~MetricsEndpoint();

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Adds `c` to every later scrape, until it is destroyed.
  void Register(std::weak_ptr<prometheus::Collectable> c);

  int port() const { return port_; }

  // The text every scrape answers now (also what tests read).
  std::string Render() const;

 private:
  MetricsEndpoint(std::unique_ptr<httplib::Server> http, int port);

  // Constant after construction
  const std::unique_ptr<httplib::Server> http_;
  const int port_;
  const std::shared_ptr<ProcessMetrics> process_;
  std::thread serve_;

  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_METRICS_ENDPOINT_H_
