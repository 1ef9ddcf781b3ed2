// Minimal leveled logging to stderr.
//
// Debian's abseil (20220623) predates absl logging, so pdserve carries this
// small logger. Each PD_LOG statement writes one whole line (timestamp, level,
// process tag, file:line, message) with a single write(2), so lines from
// concurrent threads and processes never interleave mid-line.
//
// Thread-safe. The process tag and minimum level are process-wide settings,
// meant to be set once at start-up.
#ifndef PDSERVE_COMMON_LOG_H_
#define PDSERVE_COMMON_LOG_H_

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace pdserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo, or the value of the
// PDSERVE_LOG_LEVEL environment variable (debug|info|warning|error).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// Tag written on every line, e.g. "router" or "decode-0". Default: empty.
void SetLogTag(absl::string_view tag);

namespace log_internal {

// Accumulates one line and writes it on destruction.
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Lets PD_LOG be used as a statement whose stream part is skipped entirely
// when the level is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};

// Spellings accepted by PD_LOG(level).
inline constexpr LogLevel kDEBUG = LogLevel::kDebug;
inline constexpr LogLevel kINFO = LogLevel::kInfo;
inline constexpr LogLevel kWARNING = LogLevel::kWarning;
inline constexpr LogLevel kERROR = LogLevel::kError;

}  // namespace log_internal
}  // namespace pdserve

// Usage: PD_LOG(INFO) << "listening on " << address;
// Levels: DEBUG, INFO, WARNING, ERROR.
#define PD_LOG(level)                                                  \
  !(::pdserve::log_internal::k##level >= ::pdserve::MinLogLevel())     \
      ? (void)0                                                        \
      : ::pdserve::log_internal::Voidify() &                           \
            ::pdserve::log_internal::LogLine(                          \
                ::pdserve::log_internal::k##level, __FILE__, __LINE__) \
                .stream()

#endif  // PDSERVE_COMMON_LOG_H_
