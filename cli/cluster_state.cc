#include "cli/cluster_state.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/scale.h"

namespace pdserve::cli {

namespace {
std::string HostPortOfUrl(absl::string_view url) {
  absl::ConsumePrefix(&url, "http://");
  return std::string(url.substr(0, url.find('/')));
}
}  // namespace

std::string ClusterState::HttpAddress() const { return HostPortOfUrl(http); }

std::vector<std::string> ClusterState::RouterHttpAddresses() const {
  if (routers.empty()) return {HttpAddress()};
  std::vector<std::string> addresses;
  for (const ClusterStateRouter& r : routers) {
    addresses.push_back(HostPortOfUrl(r.http));
  }
  return addresses;
}

std::map<std::string, int> ClusterState::PoolSizes() const {
  std::map<std::string, int> sizes = {
      {"prefill", 0}, {"decode", 0}, {"colocated", 0}};
  for (const ClusterStateProcess& p : processes) {
    const std::string pool = PoolOfWorker(p.name);
    if (pool.empty() || p.state == "left" || p.state == "leaving") continue;
    ++sizes[pool];
  }
  return sizes;
}

std::string ClusterStatePath(const std::string& work_dir) {
  return work_dir + "/cluster.state";
}

std::string FirstLiveRouterControl(
    const ClusterState& state,
    const std::function<bool(const std::string& control)>& answers) {
  for (const ClusterStateRouter& r : state.routers) {
    if (answers(r.control)) return r.control;
  }
  return "";
}

absl::StatusOr<ClusterState> ParseClusterState(absl::string_view text) {
  ClusterState state;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster state line ", number, ": ", why, ": ", line));
    };
    const std::vector<std::string> f =
        absl::StrSplit(line, absl::MaxSplits(' ', 7));
    if (f[0] == "pid") {
      if (f.size() != 2 || !absl::SimpleAtoi(f[1], &state.supervisor_pid) ||
          state.supervisor_pid <= 0) {
        return bad("expected 'pid N'");
      }
    } else if (f[0] == "grpc" || f[0] == "http" || f[0] == "control") {
      if (f.size() != 2) return bad("expected one address");
      (f[0] == "grpc"   ? state.grpc
       : f[0] == "http" ? state.http
                        : state.control) = f[1];
    } else if (f[0] == "token_file") {
      if (f.size() != 2) return bad("expected one path");
      state.cluster_token_file = f[1];
    } else if (f[0] == "router") {
      if (f.size() != 5) return bad("expected 'router NAME GRPC HTTP CONTROL'");
      state.routers.push_back(
          {.name = f[1], .grpc = f[2], .http = f[3], .control = f[4]});
    } else if (f[0] == "process") {
      ClusterStateProcess p;
      if (f.size() != 8 || !absl::SimpleAtoi(f[3], &p.pid) ||
          !absl::SimpleAtoi(f[6], &p.restarts)) {
        return bad(
            "expected 'process NAME ADDRESS PID LOG STATE RESTARTS "
            "LAST-EXIT'");
      }
      p.name = f[1];
      p.address = f[2];
      p.log_path = f[4];
      p.state = f[5];
      p.last_exit = f[7];
      state.processes.push_back(std::move(p));
    }
  }
  return state;
}

absl::StatusOr<ClusterState> ReadClusterState(const std::string& work_dir) {
  std::ifstream in(ClusterStatePath(work_dir));
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no local cluster is up (", ClusterStatePath(work_dir),
                     " does not exist; start one with pdctl up)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseClusterState(text.str());
}

std::string FormatClusterState(const ClusterState& state) {
  std::string out =
      absl::StrCat("pid ", state.supervisor_pid, "\ngrpc ", state.grpc,
                   "\nhttp ", state.http, "\ncontrol ", state.control, "\n");
  if (!state.cluster_token_file.empty()) {
    absl::StrAppend(&out, "token_file ", state.cluster_token_file, "\n");
  }
  for (const ClusterStateRouter& r : state.routers) {
    absl::StrAppend(&out, "router ", r.name, " ", r.grpc, " ", r.http, " ",
                    r.control, "\n");
  }
  for (const ClusterStateProcess& p : state.processes) {
    absl::StrAppend(&out, "process ", p.name, " ", p.address, " ", p.pid, " ",
                    p.log_path, " ", p.state, " ", p.restarts, " ",
                    p.last_exit.empty() ? "-" : p.last_exit, "\n");
  }
  return out;
}

absl::Status WriteClusterState(const std::string& work_dir,
                               const ClusterState& state) {
  const std::string path = ClusterStatePath(work_dir);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << FormatClusterState(state);
    if (!out.flush()) {
      return absl::UnavailableError(absl::StrCat("cannot write ", temporary));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", temporary));
  }
  return absl::OkStatus();
}

std::optional<pid_t> LiveSupervisor(const std::string& work_dir) {
  absl::StatusOr<ClusterState> state = ReadClusterState(work_dir);
  if (!state.ok() || state->supervisor_pid <= 0) return std::nullopt;
  std::ifstream cmdline(
      absl::StrCat("/proc/", state->supervisor_pid, "/cmdline"));
  std::string argv0;
  std::getline(cmdline, argv0, '\0');
  if (argv0.find("pdctl") == std::string::npos) return std::nullopt;
  return state->supervisor_pid;
}

}  // namespace pdserve::cli
