#include "worker/gemm_precision.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<GemmPrecision> ParsePrecision(const std::string& text) {
  if (text == "fp32") return GemmPrecision::kFp32;
  if (text == "tf32") return GemmPrecision::kTf32;
  if (text == "bf16") return GemmPrecision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("--precision=", text, " (want fp32, tf32 or bf16)"));
}

}  // namespace asyncps
