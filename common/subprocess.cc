#include "common/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace pdserve {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const SubprocessOptions& options) {
  if (options.argv.empty()) {
    return absl::InvalidArgumentError("Subprocess needs a program in argv[0]");
  }
  if (::access(options.argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot execute ", options.argv[0],
                                            ": ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork(): after it, only
  // async-signal-safe calls are allowed in a multi-threaded parent.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  // extra_env entries replace inherited variables of the same name.
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const std::string& extra : options.extra_env) {
      overridden |= extra.substr(0, extra.find('=')) == name;
    }
    if (!overridden) env_storage.push_back(entry);
  }
  for (const std::string& e : options.extra_env) env_storage.push_back(e);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = ::open(options.log_path.c_str(),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(absl::StrCat(
          "cannot open log ", options.log_path, ": ", std::strerror(errno)));
    }
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : options.cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      if (log_fd >= 0) ::close(log_fd);
      return absl::InvalidArgumentError(absl::StrCat("no CPU ", cpu));
    }
    CPU_SET(cpu, &cpus);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    if (log_fd >= 0) ::close(log_fd);
    return absl::InternalError(
        absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // Parent already gone.
    // Signals the parent blocks (e.g. for sigwait) must not stay blocked.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    }
    if (!options.cpus.empty() &&
        ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      // Not CPUs this process may use (say, outside its cgroup's cpuset).
      static const char kMessage[] =
          "subprocess: cannot pin to the CPUs asked for\n";
      (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      ::_exit(126);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  ::setpgid(pid, pid);  // Also from the parent, to win the race with kill.
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (running()) {
    Signal(SIGKILL);
    (void)Wait(absl::InfiniteDuration());
  }
}

void Subprocess::Signal(int signal) {
  if (wait_status_.has_value()) return;
  ::kill(-pid_, signal);
}

bool Subprocess::running() {
  if (wait_status_.has_value()) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
  } else if (r < 0 && errno == ECHILD) {
    // Reaped elsewhere (e.g. SIGCHLD ignored): it is gone, status unknown.
    wait_status_ = W_EXITCODE(255, 0);
  }
  return !wait_status_.has_value();
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return *wait_status_;
}

int Subprocess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  absl::StatusOr<int> status = Wait(grace);
  if (status.ok()) return *status;
  Signal(SIGKILL);
  return *Wait(absl::InfiniteDuration());
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace pdserve
