// Secrets: client keys, cluster tokens and one-use transfer keys, made and compared here.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace pw {

// Whether `got` equals the non-empty `secret`, compared without an early exit, so the time
// taken does not reveal a matching prefix.
bool SecretEquals(absl::string_view got, absl::string_view secret);

// A random secret (hex, 128 bits).
std::string NewSecret();

}  // namespace pw
