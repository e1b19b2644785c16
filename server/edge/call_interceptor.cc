#include "server/edge/call_interceptor.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "proto/asyncps.pb.h"

namespace asyncps {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/asyncps.v1.ParameterServer/Push" -> "Push"; other services keep their
// name ("grpc.health.v1.Health/Check").
std::string MethodLabel(absl::string_view full) {
  absl::string_view m = absl::StripPrefix(full, "/");
  return std::string(absl::StripPrefix(m, "asyncps.v1.ParameterServer/"));
}

// The size of a received request. The interceptor sees it deserialized
// (void*), so the size is asked of its own type, known per method.
using SizeOf = int64_t (*)(void*);
template <typename Request>
int64_t Size(void* m) {
  return static_cast<int64_t>(static_cast<Request*>(m)->ByteSizeLong());
}
const absl::flat_hash_map<std::string, SizeOf>& RequestSizes() {
  static const auto* sizes = new absl::flat_hash_map<std::string, SizeOf>{
      {"Push", &Size<v1::PushRequest>},
      {"Pull", &Size<v1::PullRequest>},
      {"PushPull", &Size<v1::PushPullRequest>},
      {"DeclareModel", &Size<v1::DeclareModelRequest>},
      {"Assign", &Size<v1::AssignRequest>},
      {"Register", &Size<v1::RegisterRequest>},
      {"Heartbeat", &Size<v1::HeartbeatRequest>},
  };
  return *sizes;
}

class CallInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallInterceptor(CallObserver* observer, std::string method)
      : observer_(observer), method_(std::move(method)), start_(absl::Now()) {
    const auto it = RequestSizes().find(method_);
    if (it != RequestSizes().end()) size_of_ = it->second;
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* b) override {
    if (size_of_ != nullptr && b->QueryInterceptionHookPoint(
                                   InterceptionHookPoints::POST_RECV_MESSAGE)) {
      if (void* m = b->GetRecvMessage()) received_ += size_of_(m);
    }
    if (b->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // Serialized here rather than later by gRPC: the same work, once.
      if (grpc::ByteBuffer* out = b->GetSerializedSendMessage()) {
        sent_ += static_cast<int64_t>(out->Length());
      }
    }
    if (b->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      observer_->CallEnded(
          "grpc", method_,
          static_cast<absl::StatusCode>(b->GetSendStatus().error_code()),
          absl::Now() - start_, received_, sent_);
    }
    b->Proceed();
  }

 private:
  CallObserver* const observer_;
  const std::string method_;
  const absl::Time start_;
  SizeOf size_of_ = nullptr;
  int64_t received_ = 0;
  int64_t sent_ = 0;
};

class Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(CallObserver* observer) : observer_(observer) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallInterceptor(observer_, MethodLabel(info->method()));
  }

 private:
  CallObserver* const observer_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallInterceptorFactory(CallObserver* observer) {
  return std::make_unique<Factory>(observer);
}

}  // namespace asyncps
