// Certificates for tests, made by the script users run
// (deploy/gen_certs.sh): a CA of their own, the shards' and the clients'
// certificates and keys, and the tokens.
#ifndef ASYNCPS_TESTS_TESTING_CERTS_H_
#define ASYNCPS_TESTS_TESTING_CERTS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/security.h"

namespace asyncps::testing {

// Makes a CA, its certificates and the tokens in TEST_TMPDIR/<name> (kept
// if there already) and returns the directory. A test that calls it
// depends on //tests/testing:certs, which brings the script.
std::string MakeCerts(absl::string_view name);

// The files of `who` ("server" or "client") in `dir`, trusting its CA,
// with the job's token.
SecurityFlags CertFlags(const std::string& dir, absl::string_view who);

// The same files loaded (the test fails if they do not load).
Security LoadCerts(const std::string& dir, absl::string_view who);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_TESTING_CERTS_H_
