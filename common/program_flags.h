// What every asyncps binary says about itself: its usage message, --help
// listing its own flags and the security flags every binary shares
// (common/security_flags.cc: TLS, the token), and --version.
#ifndef ASYNCPS_COMMON_PROGRAM_FLAGS_H_
#define ASYNCPS_COMMON_PROGRAM_FLAGS_H_

namespace asyncps {

// Call before absl::ParseCommandLine. `program` ("ps_server") names the
// binary: --help lists the flags of the files whose path contains it, and
// the shared security flags; --version prints "<program> (asyncps
// <version>, commit <commit>)" (common/build_info.h).
void InitProgramFlags(const char* program, const char* usage);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PROGRAM_FLAGS_H_
