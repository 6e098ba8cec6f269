#include "pw/bench/loopback_rtt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pw {
namespace {
absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat("loopback rtt: ", what, ": ", std::strerror(errno)));
}
void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
}  // namespace

absl::StatusOr<double> MeasureLoopbackRttUs(int rounds) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return Errno("bind/listen");
  }
  std::thread echo([listener, rounds] {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    NoDelay(fd);
    char b;
    for (int i = 0; i < rounds && read(fd, &b, 1) == 1 && write(fd, &b, 1) == 1; ++i) {
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  absl::Status error;
  std::vector<double> us;
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    error = Errno("connect");
  } else {
    NoDelay(fd);
    char b = 'x';
    for (int i = 0; i < rounds; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (write(fd, &b, 1) != 1 || read(fd, &b, 1) != 1) {
        error = Errno("ping");
        break;
      }
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (fd >= 0) close(fd);
  echo.join();
  close(listener);
  if (!error.ok()) return error;
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

}  // namespace pw
