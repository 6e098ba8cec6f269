// gmock matchers for absl::Status and absl::StatusOr<T>, for tests:
//   EXPECT_THAT(f(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer 3")));
#pragma once

#include <ostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace pw {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace internal

// A status (or StatusOr's) with code `code` and a message matching `message`.
MATCHER_P2(StatusIs, code, message,
           absl::StrCat("has code ", absl::StatusCodeToString(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message, negation))) {
  const absl::Status& s = internal::GetStatus(arg);
  *result_listener << "which is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(message, std::string(s.message()), result_listener);
}

}  // namespace pw
