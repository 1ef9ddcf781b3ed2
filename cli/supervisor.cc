#include "cli/supervisor.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"

namespace pdserve::cli {

absl::Duration RestartPolicy::Backoff(int consecutive_crashes) const {
  absl::Duration wait = initial_backoff;
  for (int i = 1; i < consecutive_crashes && wait < max_backoff; ++i) {
    wait *= 2;
  }
  return std::min(wait, max_backoff);
}

const char* SupervisedStateName(SupervisedState state) {
  switch (state) {
    case SupervisedState::kRunning:
      return "running";
    case SupervisedState::kBackingOff:
      return "backing-off";
    case SupervisedState::kCrashLoop:
      return "crash-loop";
    case SupervisedState::kLeft:
      return "left";
    case SupervisedState::kLeaving:
      return "leaving";
  }
  return "unknown";
}

Supervisor::Supervisor(LocalCluster& cluster, RestartPolicy policy,
                       absl::Time now)
    : cluster_(cluster), policy_(policy) {
  for (const LocalProcess& p : cluster_.processes()) {
    SupervisedProcess record;
    record.name = p.name;
    record.started = now;
    records_.push_back(std::move(record));
  }
}

void Supervisor::OnCrash(SupervisedProcess& record, const std::string& how,
                         absl::Time now) {
  record.last_exit = how;
  // A process that served for stable_uptime was healthy: this crash starts
  // a new count instead of extending a loop.
  if (now - record.started >= policy_.stable_uptime) {
    record.consecutive_crashes = 0;
  }
  ++record.consecutive_crashes;
  if (record.consecutive_crashes >= policy_.crash_loop_limit) {
    record.state = SupervisedState::kCrashLoop;
    std::cerr << "pdctl: " << record.name << " " << how << "; it crashed "
              << record.consecutive_crashes << " times in a row, each within "
              << absl::FormatDuration(policy_.stable_uptime)
              << " of its start: crash loop, left down (the rest of the "
                 "cluster keeps serving; its log: "
              << cluster_.Find(record.name)->log_path << ")" << std::endl;
    return;
  }
  const absl::Duration backoff = policy_.Backoff(record.consecutive_crashes);
  record.state = SupervisedState::kBackingOff;
  record.restart_at = now + backoff;
  std::cerr << "pdctl: " << record.name << " " << how << "; restarting in "
            << absl::FormatDuration(backoff) << " (crash "
            << record.consecutive_crashes << " of at most "
            << policy_.crash_loop_limit << " in a row)" << std::endl;
}

bool Supervisor::Poll(absl::Time now, absl::Duration restart_timeout) {
  bool changed = false;
  for (SupervisedProcess& record : records_) {
    LocalProcess* process = cluster_.Find(record.name);
    switch (record.state) {
      case SupervisedState::kRunning: {
        if (process->process->running()) break;
        changed = true;
        const absl::StatusOr<int> status =
            process->process->Wait(absl::ZeroDuration());
        const bool router = cluster_.IsRouter(record.name);
        if (status.ok() && *status == 0 && !router) {
          record.state = SupervisedState::kLeft;
          record.last_exit = DescribeWaitStatus(*status);
          std::cout << record.name << " drained and left the cluster"
                    << std::endl;
          break;
        }
        OnCrash(record, status.ok() ? DescribeWaitStatus(*status) : "exited",
                now);
        break;
      }
      case SupervisedState::kBackingOff: {
        if (now < record.restart_at) break;
        changed = true;
        const pid_t old_pid = process->process->pid();
        std::cout << "restarting " << record.name << std::endl;
        const absl::Status restarted =
            cluster_.Restart(record.name, restart_timeout);
        // Restart replaces the process once it serves gRPC; the router may
        // still be waiting for its registration, which a running process
        // completes on its own.
        process = cluster_.Find(record.name);
        const absl::Time after = absl::Now();
        if (process->process->pid() == old_pid ||
            !process->process->running()) {
          record.started = after;
          OnCrash(record,
                  absl::StrCat("failed to restart: ", restarted.message()),
                  after);
          break;
        }
        ++record.restarts;
        record.state = SupervisedState::kRunning;
        record.started = after;
        std::cout << record.name << " restarted (pid "
                  << process->process->pid() << ", restart " << record.restarts
                  << ")"
                  << (restarted.ok() ? ""
                                     : absl::StrCat("; ", restarted.message()))
                  << std::endl;
        break;
      }
      case SupervisedState::kLeaving: {
        if (process->process->running()) break;
        changed = true;
        const absl::StatusOr<int> status =
            process->process->Wait(absl::ZeroDuration());
        record.state = SupervisedState::kLeft;
        record.last_exit = status.ok() ? DescribeWaitStatus(*status) : "exited";
        std::cout << record.name << " scaled down (" << record.last_exit << ")"
                  << std::endl;
        break;
      }
      case SupervisedState::kCrashLoop:
      case SupervisedState::kLeft:
        break;
    }
  }
  return changed;
}

void Supervisor::AdoptNew(absl::Time now) {
  for (const LocalProcess& p : cluster_.processes()) {
    if (Find(p.name) != nullptr) continue;
    SupervisedProcess record;
    record.name = p.name;
    record.started = now;
    records_.push_back(std::move(record));
  }
}

bool Supervisor::Retire(const std::string& name) {
  for (SupervisedProcess& record : records_) {
    if (record.name != name) continue;
    const LocalProcess* process = cluster_.Find(name);
    if (record.state == SupervisedState::kRunning &&
        process->process->running()) {
      record.state = SupervisedState::kLeaving;
    } else if (record.state != SupervisedState::kLeft) {
      // Down already (or just exited, which Poll has not seen): nothing to
      // drain, and no restart is due any more.
      if (!process->process->running()) {
        const absl::StatusOr<int> status =
            process->process->Wait(absl::ZeroDuration());
        if (status.ok()) record.last_exit = DescribeWaitStatus(*status);
      }
      record.state = process->process->running() ? SupervisedState::kLeaving
                                                 : SupervisedState::kLeft;
    }
    return true;
  }
  return false;
}

void Supervisor::Forget(const std::string& name) {
  records_.erase(std::remove_if(records_.begin(), records_.end(),
                                [&](const SupervisedProcess& r) {
                                  return r.name == name;
                                }),
                 records_.end());
}

const SupervisedProcess* Supervisor::Find(const std::string& name) const {
  for (const SupervisedProcess& r : records_) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace pdserve::cli
