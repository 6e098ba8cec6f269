// pw-netdelay: adds a fixed one-way latency to the packets of an NFQUEUE queue, in the network
// namespace it runs in. A stand-in for `tc qdisc ... netem delay` on kernels built without netem
// (CONFIG_NET_SCH_NETEM unset, as in the VMs our CI runs on); the multi-host test uses it to delay
// the links between islands (scripts/netns-cluster-test.sh), on each host's input:
//
//   iptables -A INPUT -s 10.77.1.0/24 -j NFQUEUE --queue-num 7 --queue-bypass
//   pw-netdelay --queue 7 --delay-ms 2
//
// Delay what arrives, not what leaves: packets held at the sender's OUTPUT hook count against the
// sending socket's TCP small-queue budget, which then throttles it (measured: a 64 MiB send took
// 61 s instead of 0.17 s). The kernel holds each queued packet until its verdict; this process
// accepts every packet `delay` after it arrived, in arrival order (one queue, one fixed delay, so
// first in is first due). Only packet metadata is copied to user space; bandwidth caps stay with
// tc (htb). It stops on SIGINT/SIGTERM, accepting what it still holds; with --queue-bypass in the
// rule, packets pass undelayed while no process is bound.
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>  // ppoll (g++ defines _GNU_SOURCE)
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  uint32_t id;
  Clock::time_point due;
};

struct State {
  std::deque<Held> held;
  Clock::duration delay{};
  uint64_t delayed = 0;
};

volatile std::sig_atomic_t stop = 0;

int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* s = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* h = nfq_get_msg_packet_hdr(nfa);
  if (h == nullptr) return 0;
  s->held.push_back(Held{ntohl(h->packet_id), Clock::now() + s->delay});
  return 0;
}

int Usage(const char* argv0, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nusage: %s --queue N --delay-ms MS\n", argv0, why.c_str(), argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long queue = -1;
  double delay_ms = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    char* end = nullptr;
    if (std::strcmp(argv[i], "--queue") == 0) {
      queue = std::strtol(argv[i + 1], &end, 10);
    } else if (std::strcmp(argv[i], "--delay-ms") == 0) {
      delay_ms = std::strtod(argv[i + 1], &end);
    } else {
      return Usage(argv[0], std::string("unknown flag ") + argv[i]);
    }
    if (end == argv[i + 1] || *end != '\0')
      return Usage(argv[0], std::string("bad value for ") + argv[i] + ": " + argv[i + 1]);
  }
  if (argc % 2 == 0) return Usage(argv[0], std::string("flag without a value: ") + argv[argc - 1]);
  if (queue < 0 || queue > 65535) return Usage(argv[0], "--queue must be in [0, 65535]");
  if (!(delay_ms >= 0 && delay_ms <= 10000))
    return Usage(argv[0], "--delay-ms must be in [0, 10000]");

  State s;
  s.delay = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(delay_ms));
  nfq_handle* nfq = nfq_open();
  if (nfq == nullptr) {
    std::fprintf(stderr, "pw-netdelay: nfq_open: %s\n", std::strerror(errno));
    return 1;
  }
  nfq_q_handle* q = nfq_create_queue(nfq, static_cast<uint16_t>(queue), &OnPacket, &s);
  if (q == nullptr) {
    std::fprintf(stderr, "pw-netdelay: cannot bind queue %ld: %s\n", queue, std::strerror(errno));
    nfq_close(nfq);
    return 1;
  }
  // Metadata only; room for a few seconds of packets at full rate; GSO packets kept whole.
  if (nfq_set_mode(q, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(q, 1 << 16) < 0) {
    std::fprintf(stderr, "pw-netdelay: cannot configure queue %ld\n", queue);
    nfq_destroy_queue(q);
    nfq_close(nfq);
    return 1;
  }
  nfq_set_queue_flags(q, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  const int fd = nfq_fd(nfq);
  const int rcvbuf = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));

  // The stop signals are blocked except inside ppoll, so one cannot land between the loop's check
  // and the wait and go unnoticed.
  struct sigaction sa = {};
  sa.sa_handler = [](int) { stop = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t stops, unblocked;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  sigprocmask(SIG_BLOCK, &stops, &unblocked);
  std::fprintf(stderr, "pw-netdelay: queue %ld, delay %.3f ms\n", queue, delay_ms);

  auto release_due = [&](Clock::time_point now) {
    while (!s.held.empty() && s.held.front().due <= now) {
      nfq_set_verdict(q, s.held.front().id, NF_ACCEPT, 0, nullptr);
      s.held.pop_front();
      ++s.delayed;
    }
  };
  char buf[4096] __attribute__((aligned));
  int status = 0;
  while (!stop) {
    timespec timeout = {};
    if (!s.held.empty()) {
      const auto wait = std::max(Clock::duration::zero(), s.held.front().due - Clock::now());
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
      timeout = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    }
    pollfd p = {fd, POLLIN, 0};
    const int ready = ppoll(&p, 1, s.held.empty() ? nullptr : &timeout, &unblocked);
    if (ready < 0 && errno != EINTR) {
      std::fprintf(stderr, "pw-netdelay: poll: %s\n", std::strerror(errno));
      status = 1;
      break;
    }
    if (ready > 0) {
      // Drain what is there without blocking; each message queues one packet.
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          nfq_handle_packet(nfq, buf, static_cast<int>(n));
          continue;
        }
        if (n < 0 && errno == ENOBUFS) {
          std::fprintf(stderr, "pw-netdelay: queue %ld overran its socket; packets dropped\n",
                       queue);
          continue;
        }
        break;
      }
    }
    release_due(Clock::now());
  }
  release_due(Clock::time_point::max());
  std::fprintf(stderr, "pw-netdelay: queue %ld: %llu packets delayed\n", queue,
               static_cast<unsigned long long>(s.delayed));
  nfq_destroy_queue(q);
  nfq_close(nfq);
  return status;
}
