#include "tests/testing/certs.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {

std::string MakeCerts(absl::string_view name) {
  const std::string dir = TempPath(name);
  const std::string cmd = absl::StrCat(
      "bash ", RunfilePath("deploy/gen_certs.sh"), " ", dir, " >/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

SecurityFlags CertFlags(const std::string& dir, absl::string_view who) {
  SecurityFlags files;
  files.tls_cert = absl::StrCat(dir, "/", who, ".pem");
  files.tls_key = absl::StrCat(dir, "/", who, ".key");
  files.tls_ca = dir + "/ca.pem";
  files.auth_token_file = dir + "/token";
  return files;
}

Security LoadCerts(const std::string& dir, absl::string_view who) {
  absl::StatusOr<Security> security = LoadSecurity(CertFlags(dir, who));
  EXPECT_TRUE(security.ok()) << security.status();
  return security.ok() ? *std::move(security) : Security();
}

}  // namespace asyncps::testing
