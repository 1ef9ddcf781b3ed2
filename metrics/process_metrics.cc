#include "metrics/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace pdserve::metrics {
namespace {

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// /proc/self/stat's fields after "pid (comm)"; comm may hold spaces and
// parentheses, so the split starts after the last ')'. Index 0 is field 3
// (state) of proc(5).
absl::StatusOr<std::vector<std::string>> ReadSelfStat() {
  PD_ASSIGN_OR_RETURN(std::string stat, ReadFile("/proc/self/stat"));
  size_t close = stat.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError("cannot parse /proc/self/stat");
  }
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 22) {
    return absl::InternalError("/proc/self/stat has too few fields");
  }
  return fields;
}

// Field `number` of proc(5)'s /proc/[pid]/stat.
absl::StatusOr<double> StatField(const std::vector<std::string>& fields,
                                 int number) {
  double v = 0;
  if (!absl::SimpleAtod(fields[number - 3], &v)) {
    return absl::InternalError(
        absl::StrCat("/proc/self/stat field ", number, " is not a number"));
  }
  return v;
}

absl::StatusOr<double> BootTimeSeconds() {
  PD_ASSIGN_OR_RETURN(std::string stat, ReadFile("/proc/stat"));
  for (absl::string_view line : absl::StrSplit(stat, '\n')) {
    double v = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtod(line, &v)) {
      return v;
    }
  }
  return absl::InternalError("/proc/stat has no btime line");
}

absl::StatusOr<double> CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return absl::InternalError("cannot list /proc/self/fd");
  double n = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  // The listing includes the descriptor that reads it.
  return n - 1;
}

absl::StatusOr<double> ReadCpuSeconds() {
  PD_ASSIGN_OR_RETURN(std::vector<std::string> stat, ReadSelfStat());
  PD_ASSIGN_OR_RETURN(double utime, StatField(stat, 14));
  PD_ASSIGN_OR_RETURN(double stime, StatField(stat, 15));
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

absl::StatusOr<double> ReadResidentBytes() {
  PD_ASSIGN_OR_RETURN(std::vector<std::string> stat, ReadSelfStat());
  PD_ASSIGN_OR_RETURN(double pages, StatField(stat, 24));
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

absl::StatusOr<double> ReadStartTimeSeconds() {
  PD_ASSIGN_OR_RETURN(std::vector<std::string> stat, ReadSelfStat());
  PD_ASSIGN_OR_RETURN(double start_ticks, StatField(stat, 22));
  PD_ASSIGN_OR_RETURN(double boot, BootTimeSeconds());
  return boot + start_ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double OrNaN(const absl::StatusOr<double>& v) {
  return v.ok() ? *v : std::numeric_limits<double>::quiet_NaN();
}

MetricOptions Unlabelled(const char* name, const char* help) {
  MetricOptions options;
  options.name = name;
  options.help = help;
  return options;
}

}  // namespace

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ProcessStats out;
  PD_ASSIGN_OR_RETURN(out.cpu_seconds, ReadCpuSeconds());
  PD_ASSIGN_OR_RETURN(out.resident_memory_bytes, ReadResidentBytes());
  PD_ASSIGN_OR_RETURN(out.open_fds, CountOpenFds());
  PD_ASSIGN_OR_RETURN(out.start_time_seconds, ReadStartTimeSeconds());
  return out;
}

absl::Status AddProcessMetrics(Registry* registry, const BuildInfo& build) {
  PD_RETURN_IF_ERROR(registry->AddCounterCallback(
      Unlabelled("process_cpu_seconds_total",
                 "Total user and system CPU time spent in seconds."),
      [] { return OrNaN(ReadCpuSeconds()); }));
  PD_RETURN_IF_ERROR(
      registry->AddGaugeCallback(Unlabelled("process_resident_memory_bytes",
                                            "Resident memory size in bytes."),
                                 [] { return OrNaN(ReadResidentBytes()); }));
  PD_RETURN_IF_ERROR(registry->AddGaugeCallback(
      Unlabelled("process_open_fds", "Number of open file descriptors."),
      [] { return OrNaN(CountOpenFds()); }));
  // Fixed for the process's life: read once.
  const double start = OrNaN(ReadStartTimeSeconds());
  PD_RETURN_IF_ERROR(registry->AddGaugeCallback(
      Unlabelled("process_start_time_seconds",
                 "Start time of the process since unix epoch in seconds."),
      [start] { return start; }));
  return registry->AddInfo(
      "pdserve_build_info",
      "pdserve's version and source revision; the value is always 1.",
      {{"version", build.version}, {"revision", build.revision}});
}

}  // namespace pdserve::metrics
