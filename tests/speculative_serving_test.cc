// Speculative decoding through a real cluster: decode workers started with
// --speculative_method=ngram answer exactly what the plain offline engine
// answers (greedy and seeded sampling alike: n-gram drafts are a
// deterministic proposal, see Sampler::SampleVerifying), also for streams
// that migrate mid-way from a draining decode worker to another one, which
// resumes them speculating; the decode workers count drafted and accepted
// tokens in /metrics.
#include <signal.h>

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

TEST_F(FaultTest,
       SpeculatingDecodeWorkersAnswerAsPlainDecodingAcrossMigration) {
  OfflineEngine offline(SlowTinyModelPath());  // no speculation
  const int32_t vocab = offline.model().config().vocab_size;
  // decode-0 drains for 100 ms only: what it still streams then is handed
  // back and migrated to decode-1. Long answers (400 tokens; a random
  // model's loops are drafted well, up to 7 tokens a pass) keep streams
  // running past that on a CPU twice as fast.
  Start("speculative", 1, 2,
        {"--speculative_method=ngram", "--num_speculative_tokens=4"}, {},
        {{"decode-0", {"--drain_timeout_ms=100"}}});
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 10; ++i) {
    v1::GenerateRequest r = TokenRequest(40 + 3 * i, 300 + i, 400, vocab);
    if (i % 2 == 1) Seed(&r, 60 + i);
    if (i == 4) r.mutable_sampling()->set_disable_speculation(true);
    requests.push_back(r);
  }
  const FaultedLoad load =
      SendAllWithFault(requests, StreamsStarted(6), {"decode-0"}, SIGTERM);
  ASSERT_TRUE(load.fired());
  FaultRow row = Score("SIGTERM a speculating decode worker under load",
                       requests, load.got, offline);
  EXPECT_EQ(row.completed, row.sent);
  int migrated = 0;
  for (const Outcome& o : load.got) migrated += o.timing.migrations();
  EXPECT_GT(migrated, 0) << "no stream was handed over mid-way";
  // decode-1 speculated (it finished every migrated stream).
  const double drafted =
      Metric("decode-1", "pdserve_spec_decode_draft_tokens_total",
             {{"method", "ngram"}});
  const double accepted =
      Metric("decode-1", "pdserve_spec_decode_accepted_tokens_total",
             {{"method", "ngram"}});
  EXPECT_GT(accepted, 0);
  EXPECT_GE(drafted, accepted);  // the looping random model: often all
  row.recovery_what =
      absl::StrCat(migrated, " streams migrated; decode-1 ", accepted, "/",
                   drafted, " drafted tokens accepted");
  Report(row);
  // decode-0 drained and exited cleanly; back for the idle check.
  cli::LocalProcess* p = cluster_->Find("decode-0");
  const absl::StatusOr<int> status = p->process->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << "decode-0 did not exit after draining";
  EXPECT_EQ(*status, 0);
  ASSERT_TRUE(cluster_->Restart("decode-0", absl::Seconds(60)).ok());
}

}  // namespace
}  // namespace pdserve
