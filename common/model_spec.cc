#include "common/model_spec.h"

#include <google/protobuf/util/message_differencer.h>

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/initializer.h"
#include "common/optimizer.h"
#include "common/partitioner.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace asyncps {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 256) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                    c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckRows(const v1::EmbeddingSpec& spec,
                       absl::Span<const int64_t> ids,
                       absl::Span<const float> grads) {
  if (spec.num_rows() > 0) {
    for (int64_t id : ids) {
      if (id < 0 || id >= spec.num_rows()) {
        return absl::InvalidArgumentError(
            absl::StrCat("id ", id, " is outside embedding '", spec.name(),
                         "' of ", spec.num_rows(), " rows"));
      }
    }
  }
  const size_t d = static_cast<size_t>(spec.dim());
  for (size_t e = 0; e < grads.size(); ++e) {
    if (!std::isfinite(grads[e])) {
      return NonFiniteError(
          absl::StrCat("gradient of row ", ids[e / d], " of embedding '",
                       spec.name(), "' is ", grads[e], " at element ", e % d));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Partition> ValidateAndPartition(const v1::ModelSpec& spec) {
  // Partition::Create checks the shape of the spec (tensors, shards, slice
  // size, dtypes); the rest is checked here.
  absl::flat_hash_set<std::string> names;
  uint64_t total_bytes = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    if (!ValidName(t.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad tensor name '", t.name(),
                       "' (want 1-256 characters of [A-Za-z0-9_./-])"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "' is declared twice"));
    }
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(t));
    const uint64_t element = DTypeSize(v1::DTYPE_F32);  // What servers store.
    if (n > kMaxModelBytes / element ||
        total_bytes + n * element > kMaxModelBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model is larger than the ", kMaxModelBytes, "-byte limit"));
    }
    total_bytes += n * element;
    RETURN_IF_ERROR(ValidateInitializer(t.init(), t.name()));
  }
  RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  return Partition::Create(spec);
}

absl::Status ValidateModelSpec(const v1::ModelSpec& spec) {
  return ValidateAndPartition(spec).status();
}

std::string DescribeSpecDifference(const v1::ModelSpec& a,
                                   const v1::ModelSpec& b) {
  std::string report;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(a, b)) return "";
  std::string out(absl::StripTrailingAsciiWhitespace(report));
  if (out.size() > 500) out = absl::StrCat(out.substr(0, 500), " ...");
  return out.empty() ? "specs differ" : out;
}

}  // namespace asyncps
