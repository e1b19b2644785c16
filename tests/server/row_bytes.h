// The wire form of embedding rows for the server tests: ids as
// little-endian int64 bytes, rows and gradients as f32 bytes
// (common/tensor_bytes.h), and back.
#ifndef ASYNCPS_TESTS_SERVER_ROW_BYTES_H_
#define ASYNCPS_TESTS_SERVER_ROW_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor_bytes.h"

namespace asyncps::testing {

inline std::string Bytes(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()),
                     ids.size() * sizeof(int64_t));
}
inline std::string Bytes(const std::vector<float>& values) {
  std::string out;
  EncodeF32(values, &out);
  return out;
}
// `bytes` as floats (a whole number of them, as the shards answer).
inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v;
  DecodeF32Vector(bytes, &v);
  return v;
}

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_SERVER_ROW_BYTES_H_
