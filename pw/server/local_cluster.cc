#include "pw/server/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"
#include "pw/dataplane/shm_arena.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/cpu_binding.h"

namespace pw::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Written owner-only (cluster.json holds the cluster token).
absl::Status WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    unlink(tmp.c_str());  // A leftover could have other permissions, or be a link.
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd);
        return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    close(fd);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status SaveState(const LocalClusterState& s) {
  nlohmann::json j = {{"address", s.address},
                      {"controller_pid", s.controller_pid},
                      {"worker_pids", s.worker_pids},
                      {"worker_argv", s.worker_argv},
                      {"supervisor_pid", s.supervisor_pid},
                      {"worker_cpus", s.worker_cpus},
                      {"cluster_token", s.cluster_token},
                      {"tls_cert", s.tls.cert},
                      {"tls_key", s.tls.key},
                      {"tls_ca", s.tls.ca},
                      {"tls_server_name", s.tls.server_name}};
  return WriteFile(s.state_dir + "/cluster.json", j.dump(2) + "\n");
}

// Reaps `pid` if it is our child (a no-op otherwise).
void Reap(int pid) { (void)waitpid(pid, nullptr, WNOHANG); }

}  // namespace

bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  Reap(pid);
  if (kill(pid, 0) != 0) return false;
  // A zombie (exited, not yet reaped by its parent) counts as gone.
  absl::StatusOr<std::string> stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return false;
  size_t paren = stat->rfind(')');
  return paren == std::string::npos || paren + 2 >= stat->size() || (*stat)[paren + 2] != 'Z';
}

absl::StatusOr<std::string> StateDir() {
  std::string dir;
  if (const char* d = std::getenv("PW_STATE_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    dir = absl::StrCat(home, "/.local/state/pathways");
  } else {
    return absl::FailedPreconditionError("set PW_STATE_DIR or HOME for pw up's state");
  }
  std::error_code ec;
  const bool created = std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  // It holds the cluster token and the logs: owner-only when we make it (a directory the user
  // named that exists already keeps its mode).
  if (created && chmod(dir.c_str(), 0700) != 0)
    return absl::InternalError(absl::StrCat("cannot restrict ", dir, ": ", std::strerror(errno)));
  return dir;
}

absl::StatusOr<LocalClusterState> LoadState() {
  PW_ASSIGN_OR_RETURN(std::string dir, StateDir());
  absl::StatusOr<std::string> text = ReadFile(dir + "/cluster.json");
  if (!text.ok())
    return absl::NotFoundError(absl::StrCat("no cluster started by pw up (", dir,
                                            "/cluster.json does not exist)"));
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("address"))
    return absl::DataLossError(absl::StrCat(dir, "/cluster.json is malformed"));
  LocalClusterState s;
  s.state_dir = dir;
  try {  // A field of the wrong type throws: the file is ours, but may have been edited.
    s.address = j.value("address", "");
    s.controller_pid = j.value("controller_pid", 0);
    s.worker_pids = j.value("worker_pids", std::vector<int>{});
    s.worker_argv = j.value("worker_argv", std::vector<std::vector<std::string>>{});
    s.supervisor_pid = j.value("supervisor_pid", 0);
    s.worker_cpus = j.value("worker_cpus", std::vector<std::string>{});
    s.cluster_token = j.value("cluster_token", "");
    s.tls = {j.value("tls_cert", ""), j.value("tls_key", ""), j.value("tls_ca", ""),
             j.value("tls_server_name", "")};
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(dir, "/cluster.json is malformed: ", e.what()));
  }
  return s;
}

absl::StatusOr<int> SpawnDetached(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    sigset_t none;  // A caller's blocked signals (the supervisor's SIGTERM) are not the child's.
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setsid();
    // Never through a link someone planted in the state directory; owner-only.
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) dup2(null, 0);
    // Without its log (say, a link there was refused), to /dev/null: never the caller's output,
    // which would stay open as long as this process runs.
    const int out = fd >= 0 ? fd : null;
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return static_cast<int>(pid);
}

absl::StatusOr<LocalClusterState> LaunchLocalCluster(const ClusterSpec& spec,
                                                     const LaunchOptions& o) {
  PW_ASSIGN_OR_RETURN(std::string dir, StateDir());
  if (absl::StatusOr<LocalClusterState> old = LoadState();
      old.ok() && IsClusterProcess(old->controller_pid, *old))
    return absl::AlreadyExistsError(absl::StrCat("a cluster started by pw up is running at ",
                                                 old->address, " (pw down stops it)"));
  LocalClusterState s;
  s.state_dir = dir;
  // Checked here, so a bad file fails pw up naming it; the processes get absolute paths.
  PW_RETURN_IF_ERROR(dataplane::LoadTls(o.tls, /*server=*/true).status());
  auto absolute = [](const std::string& p) {
    return p.empty() ? p : std::filesystem::absolute(p).string();
  };
  s.tls = {absolute(o.tls.cert), absolute(o.tls.key), absolute(o.tls.ca), o.tls.server_name};
  std::vector<std::string> tls_flags;
  if (!s.tls.empty())
    tls_flags = {"--tls-cert", s.tls.cert, "--tls-key", s.tls.key, "--tls-ca", s.tls.ca};
  if (!s.tls.empty() && !s.tls.server_name.empty())
    tls_flags.insert(tls_flags.end(), {"--tls-server-name", s.tls.server_name});
  const std::string spec_path = dir + "/cluster-spec.json";
  const std::string address_file = dir + "/controller.address";
  std::remove(address_file.c_str());
  PW_RETURN_IF_ERROR(WriteFile(spec_path, spec.ToJson()));
  // The client token goes to the controller alone: workers never need it.
  const char* user_token = std::getenv("PW_TOKEN");
  absl::Cleanup restore_token = [saved = std::string(user_token ? user_token : ""),
                                 had = user_token != nullptr] {
    if (had) setenv("PW_TOKEN", saved.c_str(), 1);
    else unsetenv("PW_TOKEN");
  };
  if (!o.token.empty()) setenv("PW_TOKEN", o.token.c_str(), 1);
  // The processes' shared secret, in their environment only (not on command lines).
  s.cluster_token = NewSecret();
  setenv("PW_CLUSTER_TOKEN", s.cluster_token.c_str(), 1);
  absl::Cleanup forget_token = [] { unsetenv("PW_CLUSTER_TOKEN"); };  // On every return.
  auto fail = [&](absl::Status error) -> absl::Status {
    (void)StopLocalCluster(s, absl::Seconds(2));
    return Annotate(error, absl::StrCat("pw up (logs in ", dir, ")"));
  };
  const std::string checkpoint_root = std::filesystem::absolute(
      o.checkpoint_root.empty() ? dir + "/checkpoints" : o.checkpoint_root).lexically_normal();
  if (std::error_code ec; !std::filesystem::create_directories(checkpoint_root, ec) && ec)
    return fail(absl::InternalError(
        absl::StrCat("cannot make the checkpoint root ", checkpoint_root, ": ", ec.message())));
  std::vector<std::string> controller_argv = {
      o.pw_binary, "controller", "--config", spec_path, "--listen", "127.0.0.1:0",
      "--address-file", address_file, "--failure-timeout-ms", absl::StrCat(o.failure_timeout_ms),
      "--run-timeout-ms", absl::StrCat(o.run_timeout_ms), "--max-client-bytes",
      absl::StrCat(o.max_client_bytes), "--metrics-port", "0", "--scheduling", o.scheduling,
      "--scheduling-window-ms", absl::StrCat(o.scheduling_window_ms), "--checkpoint-root",
      checkpoint_root};
  controller_argv.insert(controller_argv.end(), tls_flags.begin(), tls_flags.end());
  PW_ASSIGN_OR_RETURN(s.controller_pid, SpawnDetached(controller_argv, dir + "/controller.log"));
  const absl::Time deadline = absl::Now() + o.ready_timeout;
  while (true) {
    if (absl::StatusOr<std::string> a = ReadFile(address_file); a.ok() && !a->empty()) {
      s.address = std::string(absl::StripAsciiWhitespace(*a));
      break;
    }
    if (!ProcessAlive(s.controller_pid)) return fail(absl::InternalError("the controller exited"));
    if (absl::Now() > deadline) return fail(absl::DeadlineExceededError("the controller did not start"));
    absl::SleepFor(absl::Milliseconds(20));
  }
  unsetenv("PW_TOKEN");
  std::vector<std::vector<int>> cpus(spec.hosts().size());
  if (o.bind_cpus) {
    absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
    if (allowed.ok()) {
      cpus = SplitCpus(*allowed, static_cast<int>(spec.hosts().size()));
    } else {
      std::fprintf(stderr, "pw up: workers left unbound: %s\n",
                   allowed.status().ToString().c_str());
    }
  }
  for (size_t i = 0; i < spec.hosts().size(); ++i) {
    const HostSpec& h = spec.hosts()[i];
    std::vector<std::string> argv = {o.pw_binary, "worker", "--controller", s.address,
                                     "--host", absl::StrCat(h.id.value()), "--metrics-port", "0"};
    s.worker_cpus.push_back(FormatCpuList(cpus[i]));
    if (!cpus[i].empty()) argv.insert(argv.end(), {"--cpus", s.worker_cpus.back()});
    if (o.collective_timeout_ms > 0)
      argv.insert(argv.end(), {"--collective-timeout-ms", absl::StrCat(o.collective_timeout_ms)});
    if (o.overrun_grace_ms >= 0)
      argv.insert(argv.end(), {"--overrun-grace-ms", absl::StrCat(o.overrun_grace_ms)});
    argv.insert(argv.end(), tls_flags.begin(), tls_flags.end());
    absl::StatusOr<int> pid =
        SpawnDetached(argv, absl::StrCat(dir, "/worker-", h.id.value(), ".log"));
    if (!pid.ok()) return fail(pid.status());
    s.worker_pids.push_back(*pid);
    s.worker_argv.push_back(std::move(argv));
  }
  if (o.restart_workers) {  // With the cluster token in its environment, for the workers.
    absl::StatusOr<int> pid = SpawnDetached({o.pw_binary, "supervise", "--state-dir", dir},
                                            dir + "/supervisor.log");
    if (!pid.ok()) return fail(pid.status());
    s.supervisor_pid = *pid;
  }
  PW_RETURN_IF_ERROR(SaveState(s));
  std::move(forget_token).Invoke();
  // Ready when every host's worker has registered.
  auto controller = rpc::RemoteController::Dial(s.address, ChannelTo(s, o.token), absl::Seconds(10));
  if (!controller.ok()) return fail(controller.status());
  while (true) {
    absl::StatusOr<::pathways::v1::ClusterStatus> st = (*controller)->FullStatus();
    int alive = 0;
    if (st.ok())
      for (const auto& m : st->members()) alive += m.alive();
    if (alive == static_cast<int>(spec.hosts().size())) break;
    for (int pid : s.worker_pids)
      if (!ProcessAlive(pid)) return fail(absl::InternalError(absl::StrCat("worker process ", pid, " exited")));
    if (absl::Now() > deadline)
      return fail(absl::DeadlineExceededError(absl::StrCat(alive, " of ", spec.hosts().size(),
                                                           " workers registered in time")));
    absl::SleepFor(absl::Milliseconds(20));
  }
  return s;
}

rpc::ChannelOptions ChannelTo(const LocalClusterState& s, std::string token) {
  rpc::ChannelOptions o{.token = std::move(token)};
  if (auto tls = dataplane::LoadTls(s.tls, /*server=*/false); tls.ok()) o.tls = *tls;
  return o;
}

bool IsClusterProcess(int pid, const LocalClusterState& s) {
  if (!ProcessAlive(pid)) return false;
  absl::StatusOr<std::string> cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  if (!cmdline.ok()) return false;
  // Arguments are NUL-separated; ours name this cluster's address file or address.
  std::vector<std::string> args = absl::StrSplit(*cmdline, '\0');
  auto has = [&](absl::string_view a) { return std::find(args.begin(), args.end(), a) != args.end(); };
  if (pid == s.controller_pid) return has("controller") && has(s.state_dir + "/controller.address");
  if (pid == s.supervisor_pid) return has("supervise") && has(s.state_dir);
  return has("worker") && has(s.address);
}

absl::Status StopLocalCluster(const LocalClusterState& state, absl::Duration grace) {
  LocalClusterState s = state;
  // The supervisor first, so it restarts nothing; then the workers it started meanwhile.
  if (IsClusterProcess(s.supervisor_pid, s)) {
    kill(s.supervisor_pid, SIGTERM);
    const absl::Time gone = absl::Now() + absl::Seconds(2);
    while (ProcessAlive(s.supervisor_pid) && absl::Now() < gone)
      absl::SleepFor(absl::Milliseconds(10));
    if (ProcessAlive(s.supervisor_pid)) kill(s.supervisor_pid, SIGKILL);
    if (absl::StatusOr<std::string> text = ReadFile(s.state_dir + "/cluster.json"); text.ok()) {
      nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("address", "") == s.address && j.contains("worker_pids") &&
          j["worker_pids"].is_array()) {
        try {
          s.worker_pids = j["worker_pids"].get<std::vector<int>>();
        } catch (const nlohmann::json::exception&) {
        }
      }
    }
  }
  // Only processes that are still this cluster's are signalled (a pid may have been reused).
  std::vector<int> pids;
  for (int pid : s.worker_pids)
    if (IsClusterProcess(pid, s)) pids.push_back(pid);
  const bool controller = IsClusterProcess(s.controller_pid, s);
  if (!s.address.empty() && controller) {
    auto c = rpc::RemoteController::Dial(s.address, ChannelTo(s, s.cluster_token), absl::Seconds(2));
    if (c.ok()) (void)(*c)->Shutdown();
  }
  for (int pid : pids) kill(pid, SIGTERM);
  if (controller) pids.push_back(s.controller_pid);
  const absl::Time deadline = absl::Now() + grace;
  std::vector<int> stuck;
  for (int pid : pids) {
    while (ProcessAlive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    if (ProcessAlive(pid)) {
      kill(pid, SIGKILL);
      stuck.push_back(pid);
    }
  }
  // Processes killed here (or earlier) leave their shared-memory segments: once they are gone
  // (init reaps them), remove those.
  const absl::Time reaped = absl::Now() + absl::Seconds(2);
  for (int pid : stuck)
    while (kill(pid, 0) == 0 && absl::Now() < reaped) absl::SleepFor(absl::Milliseconds(10));
  dataplane::RemoveStaleSegments();
  std::remove((s.state_dir + "/cluster.json").c_str());
  if (!stuck.empty())
    return absl::DeadlineExceededError(absl::StrCat("killed processes ", absl::StrJoin(stuck, ","),
                                                    " that did not stop within ",
                                                    absl::FormatDuration(grace)));
  return absl::OkStatus();
}

absl::Status SuperviseWorkers(const std::string& state_dir, absl::Duration poll) {
  setenv("PW_STATE_DIR", state_dir.c_str(), 1);  // LoadState's.
  // pw up records this process in the state once it has started it.
  for (const absl::Time until = absl::Now() + absl::Seconds(30);;) {
    absl::StatusOr<LocalClusterState> s = LoadState();
    if (s.ok() && s->supervisor_pid == getpid()) break;
    if (absl::Now() > until)
      return absl::DeadlineExceededError("the cluster's state never named this supervisor");
    absl::SleepFor(poll);
  }
  std::vector<std::vector<absl::Time>> restarts;   // Per host: when, within the window.
  std::vector<bool> given_up;
  while (true) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {  // Workers this process started, once gone.
    }
    absl::StatusOr<LocalClusterState> s = LoadState();
    if (!s.ok() || s->supervisor_pid != getpid() || !ProcessAlive(s->controller_pid))
      return absl::OkStatus();  // pw down, another supervisor, or the controller is gone.
    restarts.resize(s->worker_pids.size());
    given_up.resize(s->worker_pids.size());
    for (size_t i = 0; i < s->worker_pids.size() && i < s->worker_argv.size(); ++i) {
      if (given_up[i] || IsClusterProcess(s->worker_pids[i], *s)) continue;
      const absl::Time now = absl::Now();
      auto& r = restarts[i];
      r.erase(std::remove_if(r.begin(), r.end(),
                             [&](absl::Time t) { return now - t > kRestartWindow; }),
              r.end());
      if (static_cast<int>(r.size()) >= kMaxRestarts) {
        given_up[i] = true;
        std::fprintf(stderr, "pw supervise: worker %zu exited %d times within %s: left down\n", i,
                     kMaxRestarts, absl::FormatDuration(kRestartWindow).c_str());
        continue;
      }
      const std::vector<std::string>& argv = s->worker_argv[i];
      const auto host = std::find(argv.begin(), argv.end(), "--host");
      const std::string log = absl::StrCat(
          state_dir, "/worker-",
          host != argv.end() && host + 1 != argv.end() ? *(host + 1) : absl::StrCat(i), ".log");
      // pw down's SIGTERM waits until the new worker is in the state, where it finds it.
      sigset_t term, old;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      sigprocmask(SIG_BLOCK, &term, &old);
      absl::Cleanup unblock = [&] { sigprocmask(SIG_SETMASK, &old, nullptr); };
      absl::StatusOr<int> pid = SpawnDetached(argv, log);
      if (!pid.ok()) {
        std::fprintf(stderr, "pw supervise: cannot restart worker %zu: %s\n", i,
                     pid.status().ToString().c_str());
        continue;
      }
      std::fprintf(stderr, "pw supervise: worker %zu (pid %d) exited; restarted as pid %d\n", i,
                   s->worker_pids[i], *pid);
      r.push_back(now);
      s->worker_pids[i] = *pid;
      PW_RETURN_IF_ERROR(SaveState(*s));
    }
    absl::SleepFor(poll);
  }
}

std::string ClusterAddress(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("PW_CLUSTER"); env != nullptr && *env != '\0') return env;
  absl::StatusOr<LocalClusterState> s = LoadState();
  if (s.ok() && IsClusterProcess(s->controller_pid, *s)) return s->address;
  return "";
}

}  // namespace pw::server
