#include "common/status.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

namespace {
constexpr char kNonFinite[] = "asyncps/non-finite";
}  // namespace

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(),
                   absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&out](absl::string_view url, const absl::Cord& p) {
    out.SetPayload(url, p);
  });
  return out;
}

absl::Status NonFiniteError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kNonFinite, absl::Cord());
  return s;
}

bool IsNonFinite(const absl::Status& status) {
  return status.GetPayload(kNonFinite).has_value();
}

}  // namespace asyncps
