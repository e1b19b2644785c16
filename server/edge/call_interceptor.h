// A gRPC server interceptor that tells a CallObserver what each call cost:
// its method, status code, time from arrival to answer, and message bytes.
// Every service of the server is covered (health and reflection too).
#ifndef ASYNCPS_SERVER_EDGE_CALL_INTERCEPTOR_H_
#define ASYNCPS_SERVER_EDGE_CALL_INTERCEPTOR_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "server/edge/call_observer.h"

namespace asyncps {

// For grpc::ServerBuilder::experimental().SetInterceptorCreators.
// `observer` is borrowed and must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallInterceptorFactory(CallObserver* observer);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_CALL_INTERCEPTOR_H_
