// kv_transfer_bench: KV-shaped transfers between two processes on this host
// over UcxTransport, against ucx_perftest on the same transport in the same
// run.
//
//   kv_transfer_bench [--json=FILE] [--iterations=N] [--repetitions=R]
//
// The process re-executes itself as the receiver (its own pool, progress
// thread, descriptor handed over through a file), then as the writer runs:
//   - message sweep: one contiguous extent of 64 KiB .. 16 MiB;
//   - blocks: one layer's 16-token blocks of a 1024-token request
//     (SmolLM2-135M: 12 KiB each) scattered in the remote pool, one extent
//     per block;
//   - layer: the same layer with contiguous blocks (coalesced to one put);
//   - request: all 30 layers of that request, posted back to back.
// Each case runs R repetitions of N writes; a write is timed from PostWrite
// until it is complete at the destination. Bandwidth is the median over
// repetitions, latency percentiles are over all writes.
//
// For every message size, `ucx_perftest -t ucp_put_bw -e` (endpoints with
// peer error handling, as UcxTransport uses) runs R times between two
// processes with the same UCX_TLS, and the table prints ours / perftest.
// UCX_TLS is inherited: run once as is and once with UCX_TLS=tcp.
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
  std::vector<uint8_t> pool(kPoolBytes, 0);
  auto transport = UcxTransport::Create({.name = "bench-receiver"});
  if (!transport.ok()) {
    PD_LOG(ERROR) << transport.status();
    return 1;
  }
  auto region =
      (*transport)
          ->RegisterRegion(pool.data(), pool.size(), v1::MEMORY_KIND_HOST, 0);
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
  double median_gbps = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0;
  double perftest_gbps = 0;  // Message sweep only; 0 = not measured.
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// Times `writes` (each a list of extents, posted together as one batch and
// all awaited) R x N times.
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
  std::vector<double> latencies_us, gbps;
  for (int r = -1; r < repetitions; ++r) {  // r = -1: warm-up.
    const absl::Time start = absl::Now();
    for (int i = 0; i < iterations; ++i) {
      const absl::Time t0 = absl::Now();
      std::vector<kv_transfer::OperationId> ops;
      for (const auto& w : writes) {
        ops.push_back(*transport.PostWrite(
            {local, remote, w, absl::Now() + absl::Seconds(60)}));
      }
      for (auto op : ops) {
        const absl::Status s =
            transport.Wait(op, absl::Now() + absl::Seconds(60));
        if (!s.ok()) {
          PD_LOG(ERROR) << kind << ": " << s;
          std::exit(1);
        }
      }
      if (r >= 0) {
        latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    }
    if (r >= 0) {
      gbps.push_back(bytes * iterations /
                     absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
    }
  }
  CaseResult result;
  result.kind = kind;
  result.bytes_per_write = bytes;
  result.extents_per_write = extents;
  result.median_gbps = Median(gbps);
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

// Median over repetitions of ucx_perftest's average put bandwidth, GB/s;
// 0 when ucx_perftest is missing or fails.
double PerftestGbps(uint64_t bytes, const std::string& dir) {
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
                   "-n",     absl::StrCat(PerftestIterations(bytes)),
                   "-e"};
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
  receiver_options.argv = {SelfPath(), "--role=receiver", "--dir=" + dir};
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
    results.back().perftest_gbps = PerftestGbps(size, dir);
    std::cout << absl::StrFormat("  message %8d KiB: %.3f GB/s\n", size >> 10,
                                 results.back().median_gbps)
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
      "\n%-8s %10s %8s %10s %9s %9s %9s %12s %8s\n", "case", "bytes", "extents",
      "GB/s(med)", "p50 us", "p90 us", "p99 us", "perftest", "ratio");
  std::ofstream json(absl::GetFlag(FLAGS_json));
  json << "{\n  \"ucx_tls\": \"" << (tls ? tls : "default")
       << "\",\n  \"lanes\": \"" << lanes
       << "\",\n  \"iterations\": " << absl::GetFlag(FLAGS_iterations)
       << ",\n  \"repetitions\": " << absl::GetFlag(FLAGS_repetitions)
       << ",\n  \"cases\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    const double ratio =
        r.perftest_gbps > 0 ? r.median_gbps / r.perftest_gbps : 0;
    std::cout << absl::StrFormat(
        "%-8s %10d %8d %10.3f %9.1f %9.1f %9.1f %12s %8s\n", r.kind,
        r.bytes_per_write, r.extents_per_write, r.median_gbps, r.p50_us,
        r.p90_us, r.p99_us,
        r.perftest_gbps > 0 ? absl::StrFormat("%.3f", r.perftest_gbps) : "-",
        ratio > 0 ? absl::StrFormat("%.2f", ratio) : "-");
    json << absl::StrFormat(
        "    {\"kind\": \"%s\", \"bytes\": %d, \"extents\": %d, "
        "\"gbps\": %.4f, \"p50_us\": %.1f, \"p90_us\": %.1f, "
        "\"p99_us\": %.1f, \"perftest_gbps\": %.4f, \"ratio\": %.3f}%s\n",
        r.kind, r.bytes_per_write, r.extents_per_write, r.median_gbps, r.p50_us,
        r.p90_us, r.p99_us, r.perftest_gbps, ratio,
        i + 1 < results.size() ? "," : "");
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
