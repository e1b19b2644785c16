#include "worker/exchange_mode.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

const char* ExchangeModeName(ExchangeMode mode) {
  switch (mode) {
    case ExchangeMode::kFused:
      return "fused";
    case ExchangeMode::kPrefetch:
      return "prefetch";
    default:
      return "layered";
  }
}

absl::StatusOr<ExchangeMode> ParseExchangeMode(absl::string_view text) {
  if (text == "layered") return ExchangeMode::kLayered;
  if (text == "fused") return ExchangeMode::kFused;
  if (text == "prefetch") return ExchangeMode::kPrefetch;
  return absl::InvalidArgumentError(
      absl::StrCat("--exchange=", text, " (want layered, fused or prefetch)"));
}

}  // namespace asyncps
