#include "pw/base/log_level.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

TEST(LogLevelTest, ParsesTheFourLevelsAndRefusesOthersNamingThem) {
  EXPECT_EQ(*ParseLogLevel(""), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("ERROR"), LogLevel::kError);
  EXPECT_EQ(*ParseLogLevel("info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  absl::StatusOr<LogLevel> bad = ParseLogLevel("loud");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'loud'; use one of error, warning"));
}

TEST(LogLevelTest, XlaShowsOnlyErrorsUnlessInfoOrDebugIsAskedFor) {
  EXPECT_EQ(XlaMinLogLevel(LogLevel::kError), 2);
  EXPECT_EQ(XlaMinLogLevel(LogLevel::kWarning), 2);
  EXPECT_EQ(XlaMinLogLevel(LogLevel::kInfo), 1);
  EXPECT_EQ(XlaMinLogLevel(LogLevel::kDebug), 0);
}

TEST(LogLevelTest, SetsXlasLevelFromPwLogLevelOverJaxsDefault) {
  setenv("TF_CPP_MIN_LOG_LEVEL", "1", 1);  // What `import jax` leaves there.
  unsetenv("PW_LOG_LEVEL");
  ApplyLogLevelToXla();
  EXPECT_STREQ(getenv("TF_CPP_MIN_LOG_LEVEL"), "2");
  setenv("PW_LOG_LEVEL", "debug", 1);
  ApplyLogLevelToXla();
  EXPECT_STREQ(getenv("TF_CPP_MIN_LOG_LEVEL"), "0");
  setenv("PW_LOG_LEVEL", "nonsense", 1);  // Unknown: the default.
  ApplyLogLevelToXla();
  EXPECT_STREQ(getenv("TF_CPP_MIN_LOG_LEVEL"), "2");
  unsetenv("TF_CPP_MIN_LOG_LEVEL");
  unsetenv("PW_LOG_LEVEL");
}

}  // namespace
}  // namespace pw
