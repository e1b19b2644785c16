#include "tools/ops/psctl_export.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/embedding_client.h"
#include "common/partitioner.h"
#include "common/status_macros.h"
#include "tools/ops/npz_writer.h"

namespace asyncps {
namespace {

// The dense model's tensors into `npz`, by name (a reader's pull: no step
// waits for it).
absl::Status ExportModel(PsClient* client, NpzWriter* npz) {
  RETURN_IF_ERROR(client->FetchModel());
  const v1::ModelSpec& spec = client->spec();
  std::vector<int> all(spec.tensors_size());
  std::vector<std::vector<float>> values(spec.tensors_size());
  for (int t = 0; t < spec.tensors_size(); ++t) {
    all[t] = t;
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(spec.tensors(t)));
    values[t].resize(n);
  }
  std::vector<SliceVersion> versions;
  RETURN_IF_ERROR(client->Pull(all, &values, &versions, -1, 0));
  for (int t = 0; t < spec.tensors_size(); ++t) {
    const v1::TensorSpec& tensor = spec.tensors(t);
    std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    RETURN_IF_ERROR(npz->Add(tensor.name(), shape, values[t]));
  }
  return absl::OkStatus();
}

// Each embedding table the shards hold into `npz`: NAME (rows x dim,
// float32) and NAME.ids (int64), row k of NAME being id NAME.ids[k].
absl::StatusOr<int> ExportTables(PsClient* client,
                                 const std::vector<v1::StatsResponse>& stats,
                                 NpzWriter* npz) {
  std::map<std::string, int64_t> dims;  // Every shard holds every table.
  int64_t total = 0;                    // Rows held when Stats answered.
  for (const auto& r : stats) {
    for (const auto& e : r.embeddings()) {
      dims[e.name()] = e.dim();
      total += e.rows();
    }
  }
  EmbeddingClient tables(client->caller());
  const absl::Time start = absl::Now();
  int64_t done = 0;
  int k = 0;
  for (const auto& [name, dim] : dims) {
    std::vector<int64_t> ids;
    std::vector<float> rows;
    RETURN_IF_ERROR(tables.ReadAll(name, &ids, &rows));
    const int64_t n = static_cast<int64_t>(ids.size());
    RETURN_IF_ERROR(npz->Add(name, {n, dim}, rows));
    RETURN_IF_ERROR(npz->Add(name + ".ids", {n}, ids));
    // Progress on stderr, the ETA by the rows read so far.
    done += n;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double left =
        done > 0 && total > done ? seconds / done * (total - done) : 0;
    std::fprintf(stderr,
                 "psctl export: table %d/%zu '%s': %lld rows; %lld of about "
                 "%lld rows in %.1f s, ~%.0f s left\n",
                 ++k, dims.size(), name.c_str(), static_cast<long long>(n),
                 static_cast<long long>(done), static_cast<long long>(total),
                 seconds, left);
  }
  return static_cast<int>(dims.size());
}

// `bytes` into `out` through `out`.tmp and a rename; false (errno set, and
// no .tmp left) if any step failed.
bool WriteAtomically(const std::string& bytes, const std::string& out) {
  const std::string tmp = out + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  const bool written =
      f != nullptr &&
      std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr && std::fclose(f) != 0) f = nullptr;
  if (!written || f == nullptr || std::rename(tmp.c_str(), out.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    errno = error;
    return false;
  }
  return true;
}

}  // namespace

int ExportCommand(PsClient* client, AdminClient* admin,
                  const std::string& format, const std::string& out) {
  if (format != "npz") {
    std::fprintf(stderr, "psctl export: --format=%s (only npz is built)\n",
                 format.c_str());
    return 2;
  }
  if (out.empty()) {
    std::fprintf(stderr, "psctl export: --out=FILE is required\n");
    return 2;
  }
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = admin->StatsAll();
  if (!stats.ok()) {
    std::fprintf(stderr, "psctl export: %s\n",
                 stats.status().ToString().c_str());
    return 1;
  }
  // A job of embedding tables alone declares no dense model.
  const bool dense = (*stats)[0].model_declared();
  NpzWriter npz;
  if (absl::Status s = dense ? ExportModel(client, &npz) : absl::OkStatus();
      !s.ok()) {
    std::fprintf(stderr, "psctl export: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<int> tables = ExportTables(client, *stats, &npz);
  if (!tables.ok()) {
    std::fprintf(stderr, "psctl export: %s\n",
                 tables.status().ToString().c_str());
    return 1;
  }
  if (!dense && *tables == 0) {
    std::fprintf(stderr,
                 "psctl export: the shards hold no model and no embedding "
                 "table yet\n");
    return 1;
  }
  const std::string bytes = npz.Finish();
  if (!WriteAtomically(bytes, out)) {
    std::fprintf(stderr, "psctl export: cannot write %s: %s\n", out.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::printf(
      "exported model '%s': %d tensors, %d embedding tables, %zu "
      "bytes, to %s\n",
      dense ? client->spec().name().c_str() : "",
      dense ? client->spec().tensors_size() : 0, *tables, bytes.size(),
      out.c_str());
  return 0;
}

}  // namespace asyncps
