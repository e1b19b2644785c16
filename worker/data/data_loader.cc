#include "worker/data/data_loader.h"

#include <algorithm>
#include <cstring>

namespace asyncps {

DataLoader::DataLoader(const Dataset* data, int rank, int num_workers,
                       uint64_t seed, int64_t max_examples)
    : data_(data), seed_(seed * 1000003 + rank), max_examples_(max_examples) {
  Split(rank, num_workers);
  Shuffle();
}

void DataLoader::Split(int rank, int num_workers) {
  indices_.clear();
  for (int64_t i = rank; i < data_->size; i += num_workers) {
    indices_.push_back(i);
    if (max_examples_ > 0 &&
        static_cast<int64_t>(indices_.size()) >= max_examples_) {
      break;
    }
  }
}

void DataLoader::FollowMembership(ShareFn share) {
  share_ = std::move(share);
  if (next_ == 0) {  // At an epoch's start: its share, now.
    Reshare();
    Shuffle();
  }
}

void DataLoader::NextEpoch() {
  ++epoch_;
  Reshare();
  Shuffle();
}

void DataLoader::Reshare() {
  if (!share_) return;
  const auto [index, size] = share_();
  if (size >= 1 && index >= 0 && index < size && index < data_->size) {
    Split(index, size);
  }
}

void DataLoader::Shuffle() {
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch_) * 7919);
  std::shuffle(indices_.begin(), indices_.end(), rng);
  next_ = 0;
}

int64_t DataLoader::ShareSize(int64_t size, int rank, int num_workers,
                              int64_t max_examples) {
  const int64_t n =
      size > rank ? (size - rank + num_workers - 1) / num_workers : 0;
  return max_examples > 0 ? std::min(n, max_examples) : n;
}

void DataLoader::Skip(int64_t batches, int batch) {
  for (int64_t b = 0; b < batches; ++b) {
    next_ += std::min<size_t>(batch, indices_.size() - next_);
    if (next_ >= indices_.size()) NextEpoch();
  }
}

int DataLoader::NextBatch(int batch, std::vector<float>* x,
                          std::vector<int>* y) {
  const int n =
      static_cast<int>(std::min<size_t>(batch, indices_.size() - next_));
  const int64_t f = data_->features;
  x->resize(static_cast<size_t>(n) * f);
  y->resize(n);
  for (int k = 0; k < n; ++k) {
    const int64_t i = indices_[next_ + k];
    std::memcpy(x->data() + k * f, data_->pixels.data() + i * f,
                f * sizeof(float));
    (*y)[k] = data_->labels[i];
  }
  next_ += n;
  if (next_ >= indices_.size()) NextEpoch();
  return n;
}

}  // namespace asyncps
