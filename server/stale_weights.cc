#include "server/stale_weights.h"

#include <algorithm>

namespace asyncps {

void StaleWeights::Record(int64_t version, absl::Span<const float> weights,
                          int window) {
  const size_t n = weights.size();
  const size_t slots = static_cast<size_t>(std::max(1, window));
  size_t slot;
  if (versions_.size() < slots) {
    slot = versions_.size();
    versions_.push_back(version);
    values_.resize(versions_.size() * n);
  } else {
    slot = next_;
    versions_[slot] = version;
  }
  next_ = (slot + 1) % slots;
  std::copy(weights.begin(), weights.end(), values_.begin() + slot * n);
}

absl::Span<const float> StaleWeights::Find(int64_t version) const {
  if (versions_.empty()) return {};
  const size_t n = values_.size() / versions_.size();
  for (size_t k = 0; k < versions_.size(); ++k) {
    if (versions_[k] == version) {
      return absl::MakeConstSpan(values_).subspan(k * n, n);
    }
  }
  return {};
}

void StaleWeights::Clear() {
  versions_.clear();
  values_.clear();
  next_ = 0;
}

}  // namespace asyncps
