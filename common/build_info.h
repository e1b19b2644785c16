// What a binary was built from: the release and the git commit (stamped by
// Bazel from tools/ops/workspace_status.sh; "unknown" outside a checkout).
// --version prints both, and every /metrics serves them as
// asyncps_build_info{version,commit} 1.
#ifndef ASYNCPS_COMMON_BUILD_INFO_H_
#define ASYNCPS_COMMON_BUILD_INFO_H_

namespace asyncps {

// The release (python/package/__init__.py's __version__ says the same).
inline constexpr char kAsyncpsVersion[] = "0.5.0";

// The commit, e.g. "36fc139a1b2c" or "36fc139a1b2c-dirty".
extern const char kAsyncpsCommit[];

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_BUILD_INFO_H_
