#include "common/mode.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace asyncps {

absl::StatusOr<Mode> ParseMode(const std::string& text) {
  if (text == "async") return Mode::kAsync;
  if (text == "ssp") return Mode::kSsp;
  if (text == "bsp") return Mode::kBsp;
  if (text == "allreduce") return Mode::kAllreduce;
  return absl::InvalidArgumentError(
      absl::StrCat("--mode=", text, " (want async, ssp, bsp or allreduce)"));
}

std::string ModeName(Mode mode) {
  switch (mode) {
    case Mode::kAsync:
      return "async";
    case Mode::kSsp:
      return "ssp";
    case Mode::kBsp:
      return "bsp";
    case Mode::kAllreduce:
      return "allreduce";
  }
  return "unknown";
}

absl::StatusOr<StalePolicy> ParseStalePolicy(const std::string& text) {
  StalePolicy p;
  if (text == "none") return p;
  if (text == "scale") {
    p.kind = StalePolicy::kScale;
    return p;
  }
  if (text.rfind("drop:", 0) == 0 &&
      absl::SimpleAtoi(text.substr(5), &p.max_staleness) &&
      p.max_staleness >= 0) {
    p.kind = StalePolicy::kDrop;
    return p;
  }
  const bool adaptive = text.rfind("dca:", 0) == 0;
  if (adaptive || text.rfind("dc:", 0) == 0) {
    const std::vector<std::string> parts =
        absl::StrSplit(text.substr(adaptive ? 4 : 3), ':');
    p.kind = StalePolicy::kCompensate;
    p.dc_adaptive = adaptive;
    if (parts.size() <= 2 && absl::SimpleAtof(parts[0], &p.dc_lambda) &&
        std::isfinite(p.dc_lambda) && p.dc_lambda >= 0.0f &&
        (parts.size() == 1 ||
         (absl::SimpleAtoi(parts[1], &p.dc_window) && p.dc_window >= 1 &&
          p.dc_window <= kMaxCompensationWindow))) {
      return p;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--stale_policy=", text,
        ": delay compensation is dc:LAMBDA or dc:LAMBDA:WINDOW (dca: for "
        "an adaptive LAMBDA), with LAMBDA a number >= 0 and WINDOW "
        "(versions of the weights kept) from 1 to ",
        kMaxCompensationWindow));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--stale_policy=", text,
                   " (want none, drop:K with K >= 0, scale, "
                   "dc:LAMBDA[:WINDOW] or dca:LAMBDA[:WINDOW])"));
}

}  // namespace asyncps
