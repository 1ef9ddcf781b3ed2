#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pdserve {
namespace {

LogLevel LevelFromEnvironment() {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  const std::string value = absl::AsciiStrToLower(env);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warning") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level(static_cast<int>(LevelFromEnvironment()));
  return level;
}

absl::Mutex tag_mutex(absl::kConstInit);
std::string* tag ABSL_GUARDED_BY(tag_mutex) = nullptr;

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetMinLogLevel(LogLevel level) {
  MinLevelStorage().store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel MinLogLevel() {
  return static_cast<LogLevel>(
      MinLevelStorage().load(std::memory_order_relaxed));
}

void SetLogTag(absl::string_view new_tag) {
  absl::MutexLock lock(&tag_mutex);
  delete tag;
  tag = new std::string(new_tag);
}

namespace log_internal {

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  std::string current_tag;
  {
    absl::MutexLock lock(&tag_mutex);
    if (tag != nullptr) current_tag = *tag;
  }
  stream_ << LevelLetter(level_) << ' '
          << absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone())
          << ' ';
  if (!current_tag.empty()) stream_ << '[' << current_tag << "] ";
  stream_ << (base != nullptr ? base + 1 : file) << ':' << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write(2) per line keeps lines whole across threads and processes.
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n =
        ::write(STDERR_FILENO, text.data() + written, text.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
}

}  // namespace log_internal
}  // namespace pdserve
