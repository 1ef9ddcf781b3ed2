// KV transfers that go wrong, injected into one prefill worker's transport
// (--testing_kv_faults, kv_transfer/fault_injecting_transport.h): corrupted
// or lost bytes, a transfer cut part-way, writes stalled past the
// reservation, lost completion notices. Whatever happens, no request hangs
// and none is answered from bad KV: the decode worker refuses a transfer
// whose checksums do not match what landed (and counts it), the router
// retries the prompt on the healthy prefill worker, and every block comes
// back.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fault_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::FaultRow;
using testing::FaultTest;
using testing::OfflineEngine;
using testing::Outcome;
using testing::Seed;
using testing::SlowTinyModelPath;
using testing::TokenRequest;

struct TransferFault {
  std::string name;   // Test name.
  std::string flags;  // --testing_kv_faults of prefill-0.
  std::string what;   // For the fault table.
  // Whether the decode worker must count failed transfers and whether
  // requests must have been retried (unset: either way. A stalled
  // transfer's reservation may expire first or be given back by the writer
  // first; without the transport's notice, which is what says the bytes
  // have landed, the decode worker waits 1 s for it and then checks what
  // is there, which on a slow machine may be too early: refused, retried).
  std::optional<bool> refused;
  std::optional<bool> retried;
  // The router's --reservation_timeout_ms. Short only where the fault is a
  // stall past it: a retried prompt queues behind the healthy worker's own
  // prompts, and a reservation that ends while it waits there (seen under
  // ASan) fails that retry too and sends the third try back to prefill-0.
  int reservation_ms = 20000;
  // The transport's completion notices are dropped: the decode worker waits
  // its 1 s for each transfer's notice before it checks the bytes, so every
  // transfer from prefill-0 takes at least that long.
  bool notices_dropped = false;
};

class TransferFaultTest : public FaultTest,
                          public ::testing::WithParamInterface<TransferFault> {
};

TEST_P(TransferFaultTest, RequestsAreRetriedAndNeverAnsweredFromBadKv) {
  const TransferFault& fault = GetParam();
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  Start(absl::StrCat("transfer-", fault.name), 2, 1, {},
        {absl::StrCat("--reservation_timeout_ms=", fault.reservation_ms)},
        {{"prefill-0", {absl::StrCat("--testing_kv_faults=", fault.flags)}}});
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    v1::GenerateRequest r = TokenRequest(60 + i, 40 + i, 8, vocab);
    if (i % 2 == 1) Seed(&r, 77 + i);
    requests.push_back(r);
  }
  const std::vector<Outcome> got = SendAll(requests);

  FaultRow row = Score(fault.what, requests, got, offline);
  int retried = 0;
  int failed_tries = 0;
  double worst_ttft_ms = 0;
  for (const Outcome& o : got) {
    retried += o.timing.prefill_attempts() > 1;
    failed_tries += std::max<int>(0, o.timing.prefill_attempts() - 1);
    worst_ttft_ms = std::max(worst_ttft_ms, o.client_ttft_ms);
  }
  // Every try that failed was retried, once, as the router counts, and was
  // one failed transfer from prefill-0, whatever the reason (a failure
  // there also drops the decode pool's region, so transfers to it still in
  // flight fail as "other").
  EXPECT_EQ(Metric("router", "pdserve_request_retries_total"), failed_tries);
  EXPECT_EQ(Metric("prefill-0", "pdserve_kv_transfer_failures_total"),
            failed_tries);
  EXPECT_EQ(Metric("prefill-1", "pdserve_kv_transfer_failures_total"), 0);
  if (fault.retried == true) {
    EXPECT_GT(retried, 0) << "no request went to prefill-0";
  } else if (fault.retried == false) {
    EXPECT_EQ(retried, 0);
  }
  const uint64_t refused = Workers()["decode-0"].load().failed_kv_transfers();
  if (fault.refused == true) {
    EXPECT_GT(refused, 0u) << "the decode worker refused no transfer";
    // Each transfer the decode worker refused is one checksum failure on
    // both sides.
    const metrics::Labels checksum = {{"reason", "checksum"}};
    EXPECT_EQ(
        Metric("decode-0", "pdserve_kv_transfer_failures_total", checksum),
        refused);
    EXPECT_EQ(
        Metric("prefill-0", "pdserve_kv_transfer_failures_total", checksum),
        refused);
  } else if (fault.refused == false) {
    EXPECT_EQ(refused, 0u);
  }
  if (fault.notices_dropped) {
    // Proof that the fault fired: each request answered from prefill-0's
    // KV waited, after its first token was sampled, for the decode worker's
    // 1 s wait for the missing notice (a healthy transfer's tail, the last
    // layer's writes and the check, takes milliseconds); any other request
    // that met prefill-0 was retried.
    int from_faulty = 0;
    for (const Outcome& o : got) {
      if (!o.status.ok() || o.timing.prefill_worker_id() != "prefill-0") {
        continue;
      }
      ++from_faulty;
      EXPECT_GE(o.timing.kv_transfer_tail_ms(), 1000)
          << "a transfer from prefill-0 did not wait for its notice";
    }
    EXPECT_GT(from_faulty + retried, 0) << "no request went to prefill-0";
  }
  row.recovery = absl::Milliseconds(worst_ttft_ms);
  row.recovery_what = absl::StrCat("longest TTFT (retries included); ", retried,
                                   " requests retried; ", refused,
                                   " failed transfers counted by decode-0");
  Report(row);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, TransferFaultTest,
    ::testing::Values(
        TransferFault{"corrupt", "corrupt_writes",
                      "KV transfer corrupted (one byte flipped)", true, true},
        TransferFault{"drop", "drop_writes",
                      "KV writes dropped (reported done, nothing moved)", true,
                      true},
        TransferFault{"partial", "fail_after_bytes=200000",
                      "KV transfer cut part-way (connection fails)", false,
                      true},
        TransferFault{"stall", "delay_ms=7000",
                      "KV transfer stalled past its 5 s reservation",
                      std::nullopt, true, /*reservation_ms=*/5000},
        TransferFault{"lost_notice", "drop_notices",
                      "transport completion notice lost (gRPC notice kept)",
                      std::nullopt, std::nullopt, /*reservation_ms=*/20000,
                      /*notices_dropped=*/true}),
    [](const ::testing::TestParamInfo<TransferFault>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace pdserve
