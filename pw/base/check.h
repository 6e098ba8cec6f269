// PW_CHECK: aborts on programmer errors (never on bad input, which gets a Status).
// The abseil in Debian 12 predates absl/log, so this small macro stands in for CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>

#define PW_CHECK(cond, msg)                                                          \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   msg);                                                             \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
