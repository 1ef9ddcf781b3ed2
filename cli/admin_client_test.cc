#include "cli/admin_client.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::cli {
namespace {

using ::testing::HasSubstr;

TEST(FormatStatusTest, ShowsPoolsAndOneRowPerWorker) {
  v1::ListPoolsResponse pools;
  v1::PoolInfo* prefill = pools.add_pools();
  prefill->set_role(v1::WORKER_ROLE_PREFILL);
  prefill->set_current_size(1);
  v1::PoolInfo* decode = pools.add_pools();
  decode->set_role(v1::WORKER_ROLE_DECODE);
  decode->set_current_size(2);
  decode->set_draining(1);

  v1::ListWorkersResponse workers;
  v1::WorkerInfo* d = workers.add_workers();
  d->set_worker_id("decode-0");
  d->set_role(v1::WORKER_ROLE_DECODE);
  d->set_state(v1::WORKER_STATE_DRAINING);
  d->set_grpc_address("127.0.0.1:4001");
  d->set_inflight_requests(3);
  d->mutable_load()->set_free_kv_blocks(90);
  d->mutable_load()->set_total_kv_blocks(128);
  d->mutable_load()->set_running_sequences(5);
  d->mutable_load()->set_waiting_sequences(2);
  d->set_last_heartbeat_age_ms(120);
  v1::WorkerInfo* p = workers.add_workers();
  p->set_worker_id("prefill-0");
  p->set_role(v1::WORKER_ROLE_PREFILL);
  p->set_state(v1::WORKER_STATE_SERVING);
  p->set_grpc_address("127.0.0.1:4002");
  p->mutable_load()->set_queued_prefill_requests(7);
  p->mutable_load()->set_free_kv_blocks(256);
  p->mutable_load()->set_total_kv_blocks(256);
  v1::WorkerInfo* s = workers.add_workers();
  s->set_worker_id("starting-0");

  const std::string out = FormatStatus(pools, workers);
  EXPECT_THAT(out,
              HasSubstr("pool prefill   1 serving, 0 starting, 0 draining"));
  EXPECT_THAT(out,
              HasSubstr("pool decode    2 serving, 0 starting, 1 draining"));
  EXPECT_THAT(out, HasSubstr("decode-0"));
  EXPECT_THAT(out, HasSubstr("DRAINING"));
  EXPECT_THAT(out, HasSubstr("90/128"));
  EXPECT_THAT(out, HasSubstr("120ms"));
  EXPECT_THAT(out, HasSubstr("RUNNING WAITING     KV FREE KV USED"));
  // Running 5, waiting 2, 38 of 128 blocks in use.
  EXPECT_THAT(out, HasSubstr("        3       5       2      90/128   29.7%"));
  // A prefill worker's queued prompts wait; an idle pool is 0% used.
  EXPECT_THAT(out, HasSubstr("        0       0       7     256/256    0.0%"));
  // No heartbeat with KV yet.
  EXPECT_THAT(out, HasSubstr("        0       0       0           -       -"));
}

TEST(FormatStatusTest, SaysSoWhenNoWorkerIsRegistered) {
  EXPECT_THAT(FormatStatus({}, {}), HasSubstr("(no workers registered)"));
}

TEST(AdminClientTest, UnreachableRouterIsAnErrorNamingIt) {
  // Port 1 on loopback: nothing listens there.
  absl::StatusOr<v1::ListWorkersResponse> workers =
      ListWorkers("127.0.0.1:1", v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(2));
  ASSERT_FALSE(workers.ok());
  EXPECT_EQ(workers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(workers.status().message()),
              HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace pdserve::cli
