#include "common/program_flags.h"

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"

namespace asyncps {

void InitProgramFlags(const char* program, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  const std::string name = program;
  config.contains_help_flags = [name](absl::string_view file) {
    return absl::StrContains(file, name) ||
           absl::StrContains(file, "security_flags");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [name] {
    return absl::StrCat(name, " (asyncps ", kAsyncpsVersion, ", commit ",
                        kAsyncpsCommit, ")\n");
  };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace asyncps
