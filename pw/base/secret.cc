#include "pw/base/secret.h"

#include <random>

#include "absl/strings/str_format.h"

namespace pw {

bool SecretEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size() || b.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string NewSecret() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

}  // namespace pw
