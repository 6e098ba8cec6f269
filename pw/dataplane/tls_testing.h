// For tests: a CA and a certificate made by scripts/tls-certs.sh, loaded as a cluster process
// loads its --tls-* files. The test target defines PW_SOURCE_DIR.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pw/dataplane/tls.h"

namespace pw::dataplane {

// The files of certificate set `name` (under the test's temporary directory).
inline TlsFiles TestTlsFiles(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tls-", name);
  return {dir + "/cert.pem", dir + "/key.pem", dir + "/ca.pem"};
}

// A new CA and a certificate for `names` (DNS names and IP addresses, space-separated) as set
// `name`; null if the script failed.
inline std::shared_ptr<const Tls> MakeTestCerts(const std::string& name,
                                                const std::string& names) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tls-", name);
  const std::string cmd = absl::StrCat(PW_SOURCE_DIR, "/scripts/tls-certs.sh ", dir, " ", names);
  if (std::system(cmd.c_str()) != 0) return nullptr;
  auto tls = LoadTls(TestTlsFiles(name), /*server=*/true);
  return tls.ok() ? *tls : nullptr;
}

}  // namespace pw::dataplane
