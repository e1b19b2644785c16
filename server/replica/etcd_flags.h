// The flags that reach etcd over TLS, defined once for ps_server
// (--replicas) and psctl (group init): --etcd_tls_ca, --etcd_tls_cert,
// --etcd_tls_key.
#ifndef ASYNCPS_SERVER_REPLICA_ETCD_FLAGS_H_
#define ASYNCPS_SERVER_REPLICA_ETCD_FLAGS_H_

#include "absl/status/statusor.h"
#include "server/replica/etcd_coordinator.h"

namespace asyncps {

// The files the flags name, read. INVALID_ARGUMENT naming the flag for an
// unreadable or empty file, a certificate without its key (or the
// reverse), or either without --etcd_tls_ca.
absl::StatusOr<EtcdTls> EtcdTlsFromFlags();

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_ETCD_FLAGS_H_
