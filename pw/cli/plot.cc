#include "pw/cli/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace pw::cli {
std::string Python() {
  if (const char* p = std::getenv("PW_PYTHON"); p != nullptr && *p != '\0') return p;
  return PW_VENV_PYTHON;
}

int RunPlotter(const std::vector<std::string>& args) {
  const std::string python = Python();
  std::vector<std::string> argv = {python, "-m", "pathways.plots"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("pw: fork for the plotter");
    return 1;
  }
  if (pid == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);  // Stdout stays the JSON's.
    execvp(c[0], c.data());
    std::fprintf(stderr, "pw: could not run %s for the plot\n", python.c_str());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "pw: the plotter (%s -m pathways.plots) failed\n", python.c_str());
    return 1;
  }
  return 0;
}

absl::StatusOr<std::string> RunPythonModule(const std::string& module,
                                            const std::vector<std::string>& args) {
  const std::string python = Python();
  std::vector<std::string> argv = {python, "-m", module};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe for " + module);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork for " + module);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execvp(c[0], c.data());
    std::fprintf(stderr, "pw: could not run %s\n", python.c_str());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  close(out[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return absl::FailedPreconditionError(
        absl::StrCat(python, " -m ", module, " failed (set PW_PYTHON, or run "
                                             "scripts/install-deps.sh and make python)"));
  return text;
}

}  // namespace pw::cli
