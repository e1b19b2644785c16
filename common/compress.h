// Gradient compression on the worker -> server path (--compress, issue
// #26; docs/COMPRESSION.md): a slice's gradient travels as
//   none     f32 (or the tensor's 16-bit wire dtype), as before;
//   bf16     bfloat16, 2 bytes an element;
//   f16      IEEE half, 2 bytes an element (and in --mode=allreduce the
//            ring itself sums in f16: Horovod's fp16 compression);
//   topk:R   the ceil(R * n) largest-magnitude elements as DTYPE_TOPK:
//            uint32 k, k uint32 indices (strictly ascending), k f32 values;
//            ties in magnitude go to the lower index;
//   onebit   signs with one scale as DTYPE_ONEBIT: f32 scale (the mean
//            magnitude), then ceil(n / 8) bytes, bit i of byte i / 8 set
//            for a negative element (1-bit SGD's signs, EF-SignSGD's
//            scale); an element decodes to -scale or +scale.
// Each with error feedback (Compressor): what a slice's encoding left out
// is kept on the worker and added to that slice's next gradient, so the
// sum of what the servers applied plus the residual is exactly the sum of
// the gradients. The servers decode every form to f32 before applying it
// (DecodeGradient), so the optimizers, the modes, checkpoints and
// exactly-once are unchanged.
#ifndef ASYNCPS_COMMON_COMPRESS_H_
#define ASYNCPS_COMMON_COMPRESS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

struct Compression {
  enum Kind { kNone, kBf16, kF16, kTopK, kOneBit };
  Kind kind = kNone;
  double ratio = 0;  // topk: the fraction of elements sent, in (0, 1].

  // "none", "bf16", "f16", "topk:0.01", "onebit".
  std::string Name() const;
};

// --compress's text to a Compression; INVALID_ARGUMENT naming the text
// otherwise (an unknown kind, a ratio outside (0, 1] or not a number).
absl::StatusOr<Compression> ParseCompression(absl::string_view text);

// The number of elements top-k with `ratio` sends of `n` (at least 1 of
// a non-empty slice).
size_t TopKCount(size_t n, double ratio);

// Encodes `values` as `kind` (kTopK with `ratio`, kOneBit) into `out`;
// `sent` (values.size()) gets what the encoding decodes to.
void EncodeTopK(absl::Span<const float> values, double ratio, std::string* out,
                absl::Span<float> sent);
void EncodeOneBit(absl::Span<const float> values, std::string* out,
                  absl::Span<float> sent);

// True for the compressed dtypes (DTYPE_TOPK, DTYPE_ONEBIT).
bool IsCompressedDtype(int dtype);

// Decodes a compressed payload of `dtype` into `out` (its size: the
// slice's element count), checked whole: INVALID_ARGUMENT naming what is
// wrong (a length that disagrees with its count, an index out of range or
// not ascending (a duplicate), a non-finite value or scale) and `out`
// unspecified.
absl::Status DecodeCompressed(v1::DType dtype, absl::string_view bytes,
                              absl::Span<float> out);

// A worker's error feedback: one residual per slice it pushes, added to
// the slice's next gradient before encoding and left with what the
// encoding dropped. Thread-safe (a slice is pushed by one call at a time;
// the map is shared).
class Compressor {
 public:
  explicit Compressor(Compression c) : c_(c) {}

  // Writes `grad` (slice `slice`'s gradient) plus the slice's residual as
  // this compression into `d`'s dtype and data, and keeps the new residual.
  // kNone: as `fallback` (f32, bf16 or f16), without residual.
  // `again`: `grad` is the slice's last gradient, pushed again (bsp, after
  // a shard's restart broke the push off): `d` gets the last payload as it
  // was and the residual stays, so error feedback counts it once.
  void Encode(int slice, absl::Span<const float> grad, v1::DType fallback,
              v1::SliceData* d, bool again = false);

  // The residual kept for `slice` (empty if none yet), for tests.
  std::vector<float> Residual(int slice);

 private:
  const Compression c_;
  absl::Mutex mu_;
  // Per slice: the residual, and the last payload (for `again`).
  struct SliceState {
    std::vector<float> residual;
    std::string last;
  };
  absl::node_hash_map<int, SliceState> slices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_COMPRESS_H_
