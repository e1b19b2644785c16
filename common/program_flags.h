// What every asyncps binary says about itself: its usage message, --help
// listing its own flags and the security flags every binary shares
// (common/security_flags.cc: TLS, the token), and --version.
#ifndef ASYNCPS_COMMON_PROGRAM_FLAGS_H_
#define ASYNCPS_COMMON_PROGRAM_FLAGS_H_

namespace asyncps {

// The release (python/package/__init__.py's __version__ says the same).
inline constexpr char kAsyncpsVersion[] = "0.5.0";

// Call before absl::ParseCommandLine. `program` ("ps_server") names the
// binary: --help lists the flags of the files whose path contains it, and
// the shared security flags; --version prints "<program> (asyncps
// <version>)".
void InitProgramFlags(const char* program, const char* usage);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PROGRAM_FLAGS_H_
