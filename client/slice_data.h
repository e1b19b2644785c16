// What PsClient's files share to build and read SliceData: the key of a
// slice, its payload in a wire dtype, and views over per-tensor vectors.
// Internal to //client.
#ifndef ASYNCPS_CLIENT_SLICE_DATA_H_
#define ASYNCPS_CLIENT_SLICE_DATA_H_

#include <vector>

#include "client/ps_client.h"
#include "common/partitioner.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// The key of slice `s` of `spec`.
void FillKey(const v1::ModelSpec& spec, const SliceInfo& s, v1::SliceKey* key);

// Slice `s` of `values` (one view per tensor) as `dtype` payload, with
// its key and `version`.
void FillSliceData(const v1::ModelSpec& spec, const SliceInfo& s,
                   const ConstTensorViews& values, SliceVersion version,
                   v1::DType dtype, v1::SliceData* d);

// Views of one vector per tensor.
ConstTensorViews Views(const std::vector<std::vector<float>>& values);
TensorViews Views(std::vector<std::vector<float>>* values);

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_SLICE_DATA_H_
