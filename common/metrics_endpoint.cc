#include "common/metrics_endpoint.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace asyncps {
namespace {

// Scrapes are rare and small: two threads serve them (cpp-httplib's
// default is one per core, at least 8).
constexpr int kServeThreads = 2;

// SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which lets a
// second process bind a port already serving and share its scrapes.
void ExclusivePort(int sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, const std::string& flag) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", port, ": not a TCP port (0..65535)"));
  }
  auto http = std::make_unique<httplib::Server>();
  http->set_socket_options(ExclusivePort);
  http->new_task_queue = [] { return new httplib::ThreadPool(kServeThreads); };
  int bound = port;
  if (port == 0) {
    bound = http->bind_to_any_port(host);
    if (bound < 0) bound = 0;
  } else if (!http->bind_to_port(host, port)) {
    bound = 0;
  }
  if (bound == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", port, ": cannot serve /metrics on ", host, ":",
                     port, " (in use, or not this host's address)"));
  }
  auto endpoint = std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(http), bound));
  MetricsEndpoint* self = endpoint.get();
  self->http_->Get("/metrics", [self](const httplib::Request&,
                                      httplib::Response& res) {
    res.set_content(self->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  self->serve_ = std::thread([self] { self->http_->listen_after_bind(); });
  // stop() is a no-op until the loop runs, so the destructor would wait on
  // a listener it never stopped.
  while (!self->http_->is_running()) std::this_thread::yield();
  return endpoint;
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<httplib::Server> http,
                                 int port)
    : http_(std::move(http)),
      port_(port),
      process_(std::make_shared<ProcessMetrics>()) {
  Register(process_);
}

MetricsEndpoint::~MetricsEndpoint() {
  http_->stop();
  if (serve_.joinable()) serve_.join();
}

void MetricsEndpoint::Register(std::weak_ptr<prometheus::Collectable> c) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(c));
}

std::string MetricsEndpoint::Render() const {
  std::vector<std::shared_ptr<prometheus::Collectable>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : live) {
    auto more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace asyncps
