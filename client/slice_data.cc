#include "client/slice_data.h"

#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {

void FillKey(const v1::ModelSpec& spec, const SliceInfo& s, v1::SliceKey* key) {
  key->set_tensor(spec.tensors(s.tensor).name());
  key->set_index(s.index);
  key->set_begin(s.begin);
  key->set_count(s.count);
}

// Slice `s` of `values` (one view per tensor) as `dtype` payload.
void FillSliceData(const v1::ModelSpec& spec, const SliceInfo& s,
                   const ConstTensorViews& values, SliceVersion version,
                   v1::DType dtype, v1::SliceData* d) {
  FillKey(spec, s, d->mutable_key());
  d->set_dtype(dtype);
  d->set_version(version.version);
  d->set_incarnation(version.incarnation);
  EncodeTensor(dtype, values[s.tensor].subspan(s.begin, s.count),
               d->mutable_data());
}

ConstTensorViews Views(const std::vector<std::vector<float>>& values) {
  ConstTensorViews views;
  for (const std::vector<float>& v : values) views.emplace_back(v);
  return views;
}

TensorViews Views(std::vector<std::vector<float>>* values) {
  TensorViews views;
  for (std::vector<float>& v : *values) views.emplace_back(absl::MakeSpan(v));
  return views;
}

}  // namespace asyncps
