// KV transfers between two real processes over real UCX (pd-kv-peer):
// byte-exact delivery with default transports and with UCX_TLS=tcp, a dead
// receiver or sender detected within the deadline, and corruption detected.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
    SubprocessOptions options;
    options.argv = {PeerBinary(), role, "--dir=" + dir_};
    options.argv.insert(options.argv.end(), flags.begin(), flags.end());
    options.extra_env = std::move(env);
    options.log_path = absl::StrCat(dir_, "/", role, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> process =
        Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? std::move(process).value() : nullptr;
  }

  // Starts a receiver and waits until it has published its target.
  std::unique_ptr<Subprocess> StartReceiver(std::vector<std::string> flags,
                                            std::vector<std::string> env = {}) {
    auto receiver = Start("receive", std::move(flags), std::move(env));
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!std::filesystem::exists(dir_ + "/target.pb") &&
           absl::Now() < give_up && receiver->running()) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/target.pb")) << Log("receive");
    return receiver;
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

TEST_F(KvTransferProcessTest, MovesAPoolByteExactWithUcxDefaultTransports) {
  auto receiver = StartReceiver({"--tokens=1000"});
  auto sender = Start("send", {});
  EXPECT_EQ(ExitCode(*sender, absl::Seconds(30)), 0) << Log("send");
  EXPECT_EQ(ExitCode(*receiver, absl::Seconds(30)), 0) << Log("receive");
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
  auto receiver = StartReceiver({"--timeout_ms=60000"});
  // The receiver is alive but stops answering (SIGSTOP): no error reaches
  // the sender, so only its 2 s deadline can end the transfer.
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

}  // namespace
}  // namespace pdserve
