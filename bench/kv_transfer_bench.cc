// kv_transfer_bench: KV-shaped transfers between two processes on this host
// over UcxTransport, against ucx_perftest in the same run.
//
//   kv_transfer_bench [--json=FILE] [--iterations=N] [--repetitions=R]
//                     [--receiver_memory=allocated|registered]
//
// The process re-executes itself as the receiver (its own pool, progress
// thread, descriptor handed over through a file). The receiver's pool is
// either allocated by the transport (AllocateRegion, as a decode worker's KV
// pool is: shared memory the writer stores into directly) or ordinary memory
// registered with RegisterRegion (reached through the endpoint's lanes: TCP
// under peer error handling in UCX 1.13). Then, as the writer, it runs:
//   - message sweep: one contiguous extent of 64 KiB .. 16 MiB;
//   - blocks: one layer's 16-token blocks of a 1024-token request
//     (SmolLM2-135M: 12 KiB each) scattered in the remote pool, one extent
//     per block;
//   - layer: the same layer with contiguous blocks (coalesced to one write);
//   - request: all 30 layers of that request, posted back to back.
// Each case runs R repetitions of N writes twice: one write at a time (each
// timed from PostWrite until complete at the destination: the latency
// percentiles and "single" bandwidth), and streamed (all N posted back to
// back, then awaited: the bandwidth compared with ucx_perftest, which also
// keeps writes in flight). Bandwidths are medians over repetitions.
//
// For every message size `ucx_perftest -t ucp_put_bw` runs R times between
// two processes in each mode: with -e (endpoints with peer error handling, as
// UcxTransport's) and without (the fastest path UCX offers on this host).
// The ratio is ours (streamed) over the better of the two. UCX_TLS is
// inherited by both.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "kv_transfer/ucx_transport.h"

ABSL_FLAG(std::string, json, "kv_transfer_bench.json", "results file");
ABSL_FLAG(int32_t, iterations, 50, "writes per repetition");
ABSL_FLAG(int32_t, repetitions, 5, "repetitions of each case");
ABSL_FLAG(std::string, receiver_memory, "allocated",
          "the receiver's pool: allocated (KvTransport::AllocateRegion, as "
          "decode workers do) or registered (RegisterRegion of heap memory)");
ABSL_FLAG(std::string, role, "writer", "internal: writer | receiver");
ABSL_FLAG(std::string, dir, "", "internal: exchange folder");

namespace pdserve::bench {
namespace {

using kv_transfer::Extent;
using kv_transfer::UcxTransport;

constexpr uint64_t kPoolBytes = uint64_t{64} << 20;
// SmolLM2-135M KV: 3 KV heads x 64 dims x f16 = 384 B per token and half;
// a 16-token block of one layer holds K and V: 12 KiB.
constexpr uint64_t kBlockBytes = 2 * 16 * 384;
constexpr int kRequestBlocks = 64;  // 1024 tokens.
constexpr int kLayers = 30;

std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : "";
}

int Receiver(const std::string& dir) {
  auto transport = UcxTransport::Create({.name = "bench-receiver"});
  if (!transport.ok()) {
    PD_LOG(ERROR) << transport.status();
    return 1;
  }
  std::vector<uint8_t> heap;
  absl::StatusOr<kv_transfer::RegionId> region;
  if (absl::GetFlag(FLAGS_receiver_memory) == "allocated") {
    absl::StatusOr<kv_transfer::AllocatedRegion> allocated =
        (*transport)->AllocateRegion(kPoolBytes);
    region = allocated.ok()
                 ? absl::StatusOr<kv_transfer::RegionId>(allocated->id)
                 : allocated.status();
  } else {
    heap.assign(kPoolBytes, 0);
    region =
        (*transport)
            ->RegisterRegion(heap.data(), heap.size(), v1::MEMORY_KIND_HOST, 0);
  }
  if (!region.ok()) {
    PD_LOG(ERROR) << region.status();
    return 1;
  }
  auto descriptor = (*transport)->ExportRegion(*region);
  {
    std::ofstream out(dir + "/descriptor.pb.tmp", std::ios::binary);
    descriptor->SerializeToOstream(&out);
  }
  std::filesystem::rename(dir + "/descriptor.pb.tmp", dir + "/descriptor.pb");
  // Serve writes until the writer says it is done.
  auto done = (*transport)->AwaitNotice("done", absl::Now() + absl::Hours(1));
  return done.ok() ? 0 : 1;
}

struct CaseResult {
  std::string kind;  // "message", "blocks", "layer", "request"
  uint64_t bytes_per_write = 0;
  int extents_per_write = 0;
  double streamed_gbps = 0;                   // N writes in flight.
  double single_gbps = 0;                     // One write at a time.
  double p50_us = 0, p90_us = 0, p99_us = 0;  // One write at a time.
  // Message sweep only; 0 = not measured.
  double perftest_peer_gbps = 0;  // ucx_perftest -e
  double perftest_gbps = 0;       // ucx_perftest without -e
  double best_perftest() const {
    return std::max(perftest_peer_gbps, perftest_gbps);
  }
  double ratio() const {
    return best_perftest() > 0 ? streamed_gbps / best_perftest() : 0;
  }
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// Posts `writes` (each a list of extents, one PostWrite each) `times` times
// back to back, then waits for all of them.
void PostAndWait(UcxTransport& transport, kv_transfer::RegionId local,
                 kv_transfer::PeerRegionId remote, const std::string& kind,
                 const std::vector<std::vector<Extent>>& writes, int times) {
  std::vector<kv_transfer::OperationId> ops;
  for (int i = 0; i < times; ++i) {
    for (const auto& w : writes) {
      ops.push_back(*transport.PostWrite(
          {local, remote, w, absl::Now() + absl::Seconds(60)}));
    }
  }
  for (auto op : ops) {
    const absl::Status s = transport.Wait(op, absl::Now() + absl::Seconds(60));
    if (!s.ok()) {
      PD_LOG(ERROR) << kind << ": " << s;
      std::exit(1);
    }
  }
}

// Times `writes` R x N times one at a time, then R times N streamed.
CaseResult RunCase(UcxTransport& transport, kv_transfer::RegionId local,
                   kv_transfer::PeerRegionId remote, const std::string& kind,
                   const std::vector<std::vector<Extent>>& writes) {
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  uint64_t bytes = 0;
  int extents = 0;
  for (const auto& w : writes) {
    for (const Extent& e : w) bytes += e.length;
    extents += w.size();
  }
  std::vector<double> latencies_us, single_gbps, streamed_gbps;
  for (int r = -1; r < repetitions; ++r) {  // r = -1: warm-up.
    absl::Time start = absl::Now();
    for (int i = 0; i < iterations; ++i) {
      const absl::Time t0 = absl::Now();
      PostAndWait(transport, local, remote, kind, writes, 1);
      if (r >= 0) {
        latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    }
    const double single_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    start = absl::Now();
    PostAndWait(transport, local, remote, kind, writes, iterations);
    const double streamed_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (r >= 0) {
      single_gbps.push_back(bytes * iterations / single_seconds / 1e9);
      streamed_gbps.push_back(bytes * iterations / streamed_seconds / 1e9);
    }
  }
  CaseResult result;
  result.kind = kind;
  result.bytes_per_write = bytes;
  result.extents_per_write = extents;
  result.streamed_gbps = Median(streamed_gbps);
  result.single_gbps = Median(single_gbps);
  result.p50_us = Percentile(latencies_us, 0.5);
  result.p90_us = Percentile(latencies_us, 0.9);
  result.p99_us = Percentile(latencies_us, 0.99);
  return result;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// About 256 MiB per ucx_perftest run, within [10, 2000] iterations.
uint64_t PerftestIterations(uint64_t bytes) {
  return std::clamp<uint64_t>((uint64_t{256} << 20) / bytes, 10, 2000);
}

// Median over repetitions of ucx_perftest's average put bandwidth, GB/s, with
// or without peer error handling (-e); 0 when ucx_perftest is missing or
// fails.
double PerftestGbps(uint64_t bytes, const std::string& dir,
                    bool peer_error_handling) {
  const std::string perftest = "/usr/bin/ucx_perftest";
  if (::access(perftest.c_str(), X_OK) != 0) return 0;
  std::vector<double> results;
  for (int r = 0; r < absl::GetFlag(FLAGS_repetitions); ++r) {
    const std::string port = absl::StrCat(FreePort());
    SubprocessOptions server;
    server.argv = {perftest, "-p", port};
    server.log_path = dir + "/perftest-server.log";
    auto server_process = Subprocess::Start(server);
    if (!server_process.ok()) return 0;
    absl::SleepFor(absl::Milliseconds(300));  // Let it listen.
    SubprocessOptions client;
    const std::string log = absl::StrCat(dir, "/perftest-", bytes, "-", r);
    client.argv = {perftest, "127.0.0.1",
                   "-p",     port,
                   "-t",     "ucp_put_bw",
                   "-s",     absl::StrCat(bytes),
                   "-n",     absl::StrCat(PerftestIterations(bytes))};
    if (peer_error_handling) client.argv.push_back("-e");
    client.log_path = log;
    auto client_process = Subprocess::Start(client);
    if (!client_process.ok()) return 0;
    (void)(*client_process)->Wait(absl::Seconds(120));
    (void)(*server_process)->Wait(absl::Seconds(5));
    // "Final: iters 50%ile avg overall bw_avg(MB/s) bw_overall rate rate"
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      const std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      double mb_per_s = 0;
      if (fields.size() >= 6 && fields[0] == "Final:" &&
          absl::SimpleAtod(fields[5], &mb_per_s)) {
        results.push_back(mb_per_s * 1024 * 1024 / 1e9);
      }
    }
  }
  return results.empty() ? 0 : Median(results);
}

int Writer() {
  const std::string dir =
      absl::StrCat(std::filesystem::temp_directory_path().string(),
                   "/kv_transfer_bench.", ::getpid());
  std::filesystem::create_directories(dir);
  SubprocessOptions receiver_options;
  receiver_options.argv = {
      SelfPath(), "--role=receiver", "--dir=" + dir,
      "--receiver_memory=" + absl::GetFlag(FLAGS_receiver_memory)};
  receiver_options.log_path = dir + "/receiver.log";
  auto receiver = Subprocess::Start(receiver_options);
  if (!receiver.ok()) {
    std::cerr << receiver.status() << "\n";
    return 1;
  }
  v1::MemoryRegionDescriptor descriptor;
  for (int i = 0; i < 1000 && !std::filesystem::exists(dir + "/descriptor.pb");
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  {
    std::ifstream in(dir + "/descriptor.pb", std::ios::binary);
    if (!descriptor.ParseFromIstream(&in)) {
      std::cerr << "receiver did not start:\n"
                << cli::TailOfFile(dir + "/receiver.log");
      return 1;
    }
  }
  std::vector<uint8_t> pool(kPoolBytes, 1);
  auto transport = UcxTransport::Create({.name = "bench-writer"});
  if (!transport.ok()) {
    std::cerr << transport.status() << "\n";
    return 1;
  }
  const auto local =
      *(*transport)
           ->RegisterRegion(pool.data(), pool.size(), v1::MEMORY_KIND_HOST, 0);
  const auto remote = *(*transport)->ImportPeerRegion(descriptor);
  const std::string lanes = *(*transport)->DescribeConnection(remote);
  const char* tls = std::getenv("UCX_TLS");
  std::cout << "UCX_TLS=" << (tls ? tls : "(default)") << "; lanes: " << lanes
            << "\n";

  std::vector<CaseResult> results;
  for (uint64_t size = 64 << 10; size <= (16 << 20); size *= 4) {
    results.push_back(
        RunCase(**transport, local, remote, "message", {{Extent{0, 0, size}}}));
    results.back().perftest_peer_gbps = PerftestGbps(size, dir, true);
    results.back().perftest_gbps = PerftestGbps(size, dir, false);
    std::cout << absl::StrFormat(
                     "  message %8d KiB: %.3f GB/s streamed, %.3f one at a "
                     "time; ucx_perftest %.3f (-e) %.3f\n",
                     size >> 10, results.back().streamed_gbps,
                     results.back().single_gbps,
                     results.back().perftest_peer_gbps,
                     results.back().perftest_gbps)
              << std::flush;
  }
  // One layer of a 1024-token request: scattered (every other remote
  // block) and contiguous.
  std::vector<Extent> scattered, contiguous;
  for (int b = 0; b < kRequestBlocks; ++b) {
    scattered.push_back({b * kBlockBytes, 2 * b * kBlockBytes, kBlockBytes});
  }
  contiguous.push_back({0, 0, kRequestBlocks * kBlockBytes});
  results.push_back(RunCase(**transport, local, remote, "blocks", {scattered}));
  results.push_back(RunCase(**transport, local, remote, "layer", {contiguous}));
  std::vector<std::vector<Extent>> request;
  const uint64_t layer_bytes = kRequestBlocks * kBlockBytes;
  for (int l = 0; l < kLayers; ++l) {
    request.push_back({{l * layer_bytes, l * layer_bytes, layer_bytes}});
  }
  results.push_back(RunCase(**transport, local, remote, "request", request));

  (void)(*transport)
      ->PostNotice(remote, "done", "", absl::Now() + absl::Seconds(5));
  (void)(*receiver)->Wait(absl::Seconds(10));

  std::cout << absl::StrFormat(
      "\n%-8s %9s %4s %9s %9s %8s %8s %8s %9s %9s %6s\n", "case", "bytes",
      "ext", "streamed", "single", "p50 us", "p90 us", "p99 us", "perf -e",
      "perftest", "ratio");
  std::ofstream json(absl::GetFlag(FLAGS_json));
  json << "{\n  \"ucx_tls\": \"" << (tls ? tls : "default")
       << "\",\n  \"receiver_memory\": \""
       << absl::GetFlag(FLAGS_receiver_memory) << "\",\n  \"lanes\": \""
       << lanes << "\",\n  \"iterations\": " << absl::GetFlag(FLAGS_iterations)
       << ",\n  \"repetitions\": " << absl::GetFlag(FLAGS_repetitions)
       << ",\n  \"cases\": [\n";
  auto gbps_or_dash = [](double gbps) {
    return gbps > 0 ? absl::StrFormat("%.3f", gbps) : std::string("-");
  };
  for (size_t i = 0; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    std::cout << absl::StrFormat(
        "%-8s %9d %4d %9.3f %9.3f %8.1f %8.1f %8.1f %9s %9s %6s\n", r.kind,
        r.bytes_per_write, r.extents_per_write, r.streamed_gbps, r.single_gbps,
        r.p50_us, r.p90_us, r.p99_us, gbps_or_dash(r.perftest_peer_gbps),
        gbps_or_dash(r.perftest_gbps),
        r.ratio() > 0 ? absl::StrFormat("%.2f", r.ratio()) : "-");
    json << absl::StrFormat(
        "    {\"kind\": \"%s\", \"bytes\": %d, \"extents\": %d, "
        "\"gbps\": %.4f, \"single_gbps\": %.4f, \"p50_us\": %.1f, "
        "\"p90_us\": %.1f, \"p99_us\": %.1f, \"perftest_peer_gbps\": %.4f, "
        "\"perftest_gbps\": %.4f, \"ratio\": %.3f}%s\n",
        r.kind, r.bytes_per_write, r.extents_per_write, r.streamed_gbps,
        r.single_gbps, r.p50_us, r.p90_us, r.p99_us, r.perftest_peer_gbps,
        r.perftest_gbps, r.ratio(), i + 1 < results.size() ? "," : "");
  }
  json << "  ]\n}\n";
  std::cout << "JSON written to " << absl::GetFlag(FLAGS_json) << "\n";
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "receiver") {
    pdserve::SetLogTag("receiver");
    return pdserve::bench::Receiver(absl::GetFlag(FLAGS_dir));
  }
  return pdserve::bench::Writer();
}
