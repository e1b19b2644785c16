// gRPC credentials from a process's security settings (common/security.h):
// built where a server listens or a client opens its channels, so the
// settings themselves stay plain data.
#ifndef ASYNCPS_RPC_GRPC_CREDENTIALS_H_
#define ASYNCPS_RPC_GRPC_CREDENTIALS_H_

#include <memory>

#include "common/security.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace asyncps {

// A server's credentials: plaintext, TLS with its certificate, or mutual
// TLS (clients must present a certificate the CA signed) when it has a CA.
// REQUIRES: a server with TLS has a certificate.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const Security& security);

// A client's: plaintext, or TLS trusting the CA (the system's roots if
// none), presenting its own certificate if it has one.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const Security& security);

}  // namespace asyncps

#endif  // ASYNCPS_RPC_GRPC_CREDENTIALS_H_
