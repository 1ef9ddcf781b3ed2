// KV transfers between two real processes over real UCX (pd-kv-peer):
// byte-exact delivery into a pool the transport allocated (shared memory the
// sender stores into directly, as a decode worker's pool) and into a
// registered one (written through the endpoint), also with UCX_TLS=tcp; a
// dead receiver or sender detected within the deadline; corruption
// detected; and a receiver killed in the middle of a large direct write,
// after which the same writer moves a request byte-exact into a new one.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_transfer/kv_block_transfer.h"
#include "kv_transfer/ucx_transport.h"
#include "proto/kv_transfer.pb.h"

namespace pdserve {
namespace {

using ::testing::HasSubstr;

std::string PeerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/pdserve/kv_transfer/pd-kv-peer");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  std::string content(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(content.data(), content.size());
  return content;
}

class KvTransferProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::unique_ptr<Subprocess> Start(const std::string& role,
                                    std::vector<std::string> flags,
                                    std::vector<std::string> env = {}) {
    return StartIn(dir_, role, std::move(flags), std::move(env));
  }

  std::unique_ptr<Subprocess> StartIn(const std::string& dir,
                                      const std::string& role,
                                      std::vector<std::string> flags,
                                      std::vector<std::string> env = {}) {
    SubprocessOptions options;
    options.argv = {PeerBinary(), role, "--dir=" + dir};
    options.argv.insert(options.argv.end(), flags.begin(), flags.end());
    options.extra_env = std::move(env);
    options.log_path = absl::StrCat(dir, "/", role, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> process =
        Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? std::move(process).value() : nullptr;
  }

  // Starts a receiver and waits until it has published its target.
  std::unique_ptr<Subprocess> StartReceiver(std::vector<std::string> flags,
                                            std::vector<std::string> env = {}) {
    return StartReceiverIn(dir_, std::move(flags), std::move(env));
  }

  std::unique_ptr<Subprocess> StartReceiverIn(
      const std::string& dir, std::vector<std::string> flags,
      std::vector<std::string> env = {}) {
    auto receiver = StartIn(dir, "receive", std::move(flags), std::move(env));
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!std::filesystem::exists(dir + "/target.pb") &&
           absl::Now() < give_up && receiver->running()) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(std::filesystem::exists(dir + "/target.pb"))
        << cli::TailOfFile(dir + "/receive.log");
    return receiver;
  }

  v1::KvTransferTarget ReadTarget(const std::string& dir) {
    v1::KvTransferTarget target;
    EXPECT_TRUE(target.ParseFromString(ReadFile(dir + "/target.pb")));
    return target;
  }

  int ExitCode(Subprocess& process, absl::Duration timeout) {
    absl::StatusOr<int> status = process.Wait(timeout);
    EXPECT_TRUE(status.ok()) << "process did not exit: " << status.status();
    if (!status.ok()) return -1;
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -WTERMSIG(*status);
  }

  std::string Log(const std::string& role) {
    return cli::TailOfFile(absl::StrCat(dir_, "/", role, ".log"));
  }

  // Compares, byte for byte, every token the transfer had to move, with
  // offsets computed here from the layout's definition (not through the
  // code under test), and checks that every other byte of the receiver's
  // pool still holds what the receiver put there before the transfer.
  void ExpectByteExact() {
    v1::KvTransferTarget target;
    ASSERT_TRUE(target.ParseFromString(ReadFile(dir_ + "/target.pb")));
    const std::string source = ReadFile(dir_ + "/source.bin");
    const std::string received = ReadFile(dir_ + "/pool.bin");
    const v1::KvLayout& layout = target.layout();
    const uint64_t token_bytes =
        uint64_t{layout.num_kv_heads()} * layout.head_dim() * 2;  // f16
    const uint64_t half_block = token_bytes * layout.block_size_tokens();
    const uint64_t layer_stride = 2 * half_block * layout.num_blocks();
    ASSERT_EQ(source.size(), layer_stride * layout.num_layers());
    ASSERT_EQ(received.size(), source.size());
    // The receiver's pool before the transfer (pd-kv-peer's fill, seed 2).
    std::string original(received.size(), '\0');
    std::mt19937_64 rng(2);
    for (size_t i = 0; i + 8 <= original.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(original.data() + i, &v, 8);
    }
    std::vector<bool> written(received.size(), false);
    for (uint32_t layer = 0; layer < layout.num_layers(); ++layer) {
      for (uint32_t pos = 0; pos < target.num_tokens(); ++pos) {
        const uint32_t index = pos / layout.block_size_tokens();
        const uint32_t slot = pos % layout.block_size_tokens();
        for (uint64_t half = 0; half < 2; ++half) {
          // pd-kv-peer send keeps the request in its blocks 0..n-1.
          const uint64_t from = layer * layer_stride + index * 2 * half_block +
                                half * half_block + slot * token_bytes;
          const uint64_t to =
              layer * layer_stride +
              uint64_t{target.block_ids(index)} * 2 * half_block +
              half * half_block + slot * token_bytes;
          ASSERT_EQ(
              source.compare(from, token_bytes, received, to, token_bytes), 0)
              << "layer " << layer << " position " << pos << " half " << half;
          std::fill(written.begin() + to, written.begin() + to + token_bytes,
                    true);
        }
      }
    }
    for (size_t i = 0; i < received.size(); ++i) {
      if (!written[i]) {
        ASSERT_EQ(received[i], original[i])
            << "byte " << i << " changed but was not to be written";
      }
    }
  }

  std::string dir_;
};

// What pd-kv-peer's sender logs when it imports the receiver's region.
constexpr char kDirect[] = "is shared memory: writes store into it directly";
constexpr char kThroughLanes[] = "is written through the endpoint's lanes";

TEST_F(KvTransferProcessTest, StoresDirectlyIntoAnAllocatedPoolByteExact) {
  auto receiver = StartReceiver({"--tokens=1000"});
  auto sender = Start("send", {});
  EXPECT_EQ(ExitCode(*sender, absl::Seconds(30)), 0) << Log("send");
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(30)), 0) << Log("receive");
  EXPECT_THAT(Log("send"), HasSubstr(kDirect));
  ExpectByteExact();
}

TEST_F(KvTransferProcessTest, WritesARegisteredPoolThroughTheEndpoint) {
  auto receiver = StartReceiver({"--tokens=1000", "--pool=registered"});
  auto sender = Start("send", {});
  EXPECT_EQ(ExitCode(*sender, absl::Seconds(30)), 0) << Log("send");
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(30)), 0) << Log("receive");
  EXPECT_THAT(Log("send"), HasSubstr(kThroughLanes));
  ExpectByteExact();
}

TEST_F(KvTransferProcessTest, MovesAPoolByteExactOverTcp) {
  auto receiver = StartReceiver({"--tokens=777"}, {"UCX_TLS=tcp"});
  auto sender = Start("send", {}, {"UCX_TLS=tcp"});
  EXPECT_EQ(ExitCode(*sender, absl::Seconds(30)), 0) << Log("send");
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(30)), 0) << Log("receive");
  EXPECT_THAT(Log("send"), HasSubstr("tcp"));
  ExpectByteExact();
}

TEST_F(KvTransferProcessTest, ACorruptedTransferIsReportedAsDataLoss) {
  auto receiver = StartReceiver({});
  auto sender = Start("send", {"--corrupt"});
  EXPECT_EQ(ExitCode(*sender, absl::Seconds(30)), 0) << Log("send");
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(30)), 3) << Log("receive");
  EXPECT_THAT(ReadFile(dir_ + "/result.txt"), HasSubstr("corrupt"));
}

TEST_F(KvTransferProcessTest,
       TheSenderFailsWithinItsDeadlineWhenTheReceiverDies) {
  auto receiver = StartReceiver({"--timeout_ms=60000"});
  // 30 layers, 100 ms apart: the transfer takes ~3 s; the receiver dies
  // after ~0.5 s. The sender's deadline is 4 s.
  auto sender = Start("send", {"--layer_delay_ms=100", "--timeout_ms=4000"});
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time killed = absl::Now();
  receiver->Signal(SIGKILL);
  const int code = ExitCode(*sender, absl::Seconds(20));
  const absl::Duration took = absl::Now() - killed;
  // UCX's peer error handling notices the death (UNAVAILABLE) well before
  // the deadline, and the writer stops at the next layer.
  EXPECT_EQ(code, 5) << Log("send");
  EXPECT_LT(took, absl::Seconds(3)) << Log("send");
  EXPECT_THAT(ReadFile(dir_ + "/result.txt"), HasSubstr("UNAVAILABLE"));
}

TEST_F(KvTransferProcessTest, AStalledReceiverFailsTheSenderAtItsDeadline) {
  auto receiver = StartReceiver({"--timeout_ms=60000", "--pool=registered"});
  // The receiver is alive but stops answering (SIGSTOP): no error reaches
  // the sender, whose writes through the endpoint need the receiver's
  // progress, so only its 2 s deadline can end the transfer.
  auto sender = Start("send", {"--layer_delay_ms=100", "--timeout_ms=2000"});
  absl::SleepFor(absl::Milliseconds(300));
  receiver->Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  const int code = ExitCode(*sender, absl::Seconds(20));
  receiver->Signal(SIGCONT);
  EXPECT_EQ(code, 4) << Log("send");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << Log("send");
  EXPECT_THAT(ReadFile(dir_ + "/result.txt"), HasSubstr("DEADLINE_EXCEEDED"));
}

TEST_F(KvTransferProcessTest,
       TheReceiverFailsWithinItsDeadlineWhenTheSenderDies) {
  auto receiver = StartReceiver({"--timeout_ms=2500"});
  auto sender = Start("send", {"--layer_delay_ms=100", "--timeout_ms=60000"});
  absl::SleepFor(absl::Milliseconds(500));
  sender->Signal(SIGKILL);
  const absl::Time start = absl::Now();
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(20)), 4) << Log("receive");
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_THAT(ReadFile(dir_ + "/result.txt"), HasSubstr("DEADLINE_EXCEEDED"));
}

// The writer side of a transfer, in this process: the request's KV from
// `source` (laid out as pd-kv-peer send lays it: blocks 0..n-1 of a pool
// with the target's layout) into `target`'s blocks.
absl::Status TransferFromThisProcess(kv_transfer::KvTransport& transport,
                                     kv_transfer::RegionId local,
                                     const std::vector<uint8_t>& source,
                                     const v1::KvTransferTarget& target) {
  PD_ASSIGN_OR_RETURN(const kv_transfer::PeerRegionId remote,
                      transport.ImportPeerRegion(target.region()));
  kv_transfer::KvTransferWriterOptions options;
  options.transport = &transport;
  options.local_region = local;
  options.local_pool = source.data();
  options.local_layout = target.layout();
  for (int i = 0; i < target.block_ids_size(); ++i) {
    options.local_block_ids.push_back(i);
  }
  options.target = target;
  options.remote_region = remote;
  options.prefill_worker_id = "test";
  options.deadline = absl::Now() + absl::Seconds(10);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<kv_transfer::KvTransferWriter> writer,
                      kv_transfer::KvTransferWriter::Create(options));
  for (uint32_t layer = 0; layer < target.layout().num_layers(); ++layer) {
    PD_RETURN_IF_ERROR(writer->WriteLayer(layer));
  }
  return writer->Finish().status();
}

TEST_F(KvTransferProcessTest,
       AReceiverKilledInTheMiddleOfALargeDirectWriteCorruptsNothingLater) {
  // Receiver A: a 250 MB pool the transport allocated (shared memory), in a
  // folder of its own.
  const std::string a_dir = dir_ + "/a";
  std::filesystem::create_directories(a_dir);
  auto a = StartReceiverIn(
      a_dir, {"--blocks=700", "--tokens=16", "--timeout_ms=60000"});
  const v1::KvTransferTarget a_target = ReadTarget(a_dir);
  const uint64_t pool_bytes = a_target.region().length_bytes();
  ASSERT_GT(pool_bytes, uint64_t{200} << 20);

  // This process writes: the pool pd-kv-peer's receivers check against
  // (seed 1), dumped for ExpectByteExact.
  std::vector<uint8_t> source(pool_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= source.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(source.data() + i, &v, 8);
  }
  auto transport = kv_transfer::UcxTransport::Create({.name = "test-writer"});
  ASSERT_TRUE(transport.ok()) << transport.status();
  const absl::StatusOr<kv_transfer::RegionId> local =
      (*transport)
          ->RegisterRegion(source.data(), source.size(), v1::MEMORY_KIND_HOST,
                           0);
  ASSERT_TRUE(local.ok()) << local.status();
  const absl::StatusOr<kv_transfer::PeerRegionId> to_a =
      (*transport)->ImportPeerRegion(a_target.region());
  ASSERT_TRUE(to_a.ok()) << to_a.status();
  EXPECT_THAT(*(*transport)->DescribeConnection(*to_a),
              HasSubstr("direct stores"));

  // Whole-pool writes into A, one after another, until one fails (or 20 s
  // pass: the test then fails below instead of hanging).
  std::atomic<int> writes_started{0};
  std::atomic<bool> in_write{false};
  absl::Status last_write;
  absl::Time failed_at;
  const absl::Time stop_writing = absl::Now() + absl::Seconds(20);
  std::thread writer([&] {
    while (absl::Now() < stop_writing) {
      writes_started.fetch_add(1);
      in_write = true;
      absl::StatusOr<kv_transfer::OperationId> op =
          (*transport)
              ->PostWrite({*local,
                           *to_a,
                           {{0, 0, pool_bytes}},
                           absl::Now() + absl::Seconds(5)});
      last_write = op.ok() ? (*transport)->Wait(*op, absl::InfiniteFuture())
                           : op.status();
      in_write = false;
      if (!last_write.ok()) {
        failed_at = absl::Now();
        return;
      }
    }
  });
  // Kill A a few milliseconds into the third write (each takes tens of
  // milliseconds: 250 MB), and note whether that write was still running.
  while (writes_started.load() < 3) absl::SleepFor(absl::Microseconds(100));
  absl::SleepFor(absl::Milliseconds(3));
  const int write_at_kill = writes_started.load();
  a->Signal(SIGKILL);
  const bool killed_mid_write = in_write.load() && write_at_kill == 3 &&
                                writes_started.load() == write_at_kill;
  const absl::Time killed = absl::Now();
  writer.join();
  EXPECT_TRUE(killed_mid_write);
  // The death reaches the writer through the endpoint (its TCP connection),
  // and no write stores into A after that: the next one fails at once.
  EXPECT_EQ(last_write.code(), absl::StatusCode::kUnavailable) << last_write;
  EXPECT_LT(failed_at - killed, absl::Seconds(5));
  EXPECT_EQ(ExitCode(*a, absl::Seconds(5)), -SIGKILL);
  absl::StatusOr<kv_transfer::OperationId> notice =
      (*transport)
          ->PostNotice(*to_a, a_target.transfer_id(), "",
                       absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(notice.ok());
  EXPECT_FALSE(
      (*transport)->Wait(*notice, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE((*transport)->ReleasePeerRegion(*to_a).ok());

  // Receiver B, a new process: the same writer moves a request into it,
  // byte-exact, and nothing else of B's pool changes.
  auto b = StartReceiver({"--tokens=1000", "--blocks=96"});
  const v1::KvTransferTarget b_target = ReadTarget(dir_);
  std::vector<uint8_t> b_source(b_target.region().length_bytes());
  std::memcpy(b_source.data(), source.data(), b_source.size());
  {
    std::ofstream out(dir_ + "/source.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(b_source.data()), b_source.size());
  }
  const absl::StatusOr<kv_transfer::RegionId> b_local =
      (*transport)
          ->RegisterRegion(b_source.data(), b_source.size(),
                           v1::MEMORY_KIND_HOST, 0);
  ASSERT_TRUE(b_local.ok()) << b_local.status();
  EXPECT_TRUE(
      TransferFromThisProcess(**transport, *b_local, b_source, b_target).ok());
  EXPECT_EQ(ExitCode(*b, absl::Seconds(30)), 0) << Log("receive");
  ExpectByteExact();
}

}  // namespace
}  // namespace pdserve
