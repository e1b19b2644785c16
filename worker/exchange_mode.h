// ExchangeMode: how a PsExchange moves a step's gradients and weights
// (--exchange; worker/ps_exchange.h says what each way does). Apart from
// PsExchange so that the worker's flags can name it without the client.
#ifndef ASYNCPS_WORKER_EXCHANGE_MODE_H_
#define ASYNCPS_WORKER_EXCHANGE_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

enum class ExchangeMode { kLayered, kFused, kPrefetch };

// "layered", "fused", "prefetch" (--exchange); INVALID_ARGUMENT naming the
// flag and those otherwise.
absl::StatusOr<ExchangeMode> ParseExchangeMode(absl::string_view text);
const char* ExchangeModeName(ExchangeMode mode);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EXCHANGE_MODE_H_
