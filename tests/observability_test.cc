// Observing a real local cluster (pd-router, pd-prefill-worker,
// pd-decode-worker as separate processes): every worker serves its
// Prometheus metrics where it registered them, and one request's id (the
// client's x-request-id, over HTTP or gRPC metadata) reaches every process
// and every log line about the request, so its timeline can be read across
// the router's and the workers' logs.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/admin_client.h"
#include "cli/local_cluster.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/client.grpc.pb.h"
#include "tests/cluster_testing.h"

namespace pdserve {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class ObservabilityTest : public ::testing::Test {
 protected:
  void StartCluster(const std::string& name) {
    cli::LocalClusterOptions options;
    options.bin_dir = testing::BinDir();
    options.work_dir = testing::MakeWorkDir(name);
    options.model_path = testing::TinyModelPath();
    options.worker_args = testing::SmallWorkerArgs();
    absl::StatusOr<std::unique_ptr<cli::LocalCluster>> cluster =
        cli::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(10)).ok());
    }
  }

  // The lines of `process`'s log that mention `text`.
  std::vector<std::string> LogLines(const std::string& process,
                                    const std::string& text) {
    std::ifstream in(cluster_->Find(process)->log_path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (absl::StrContains(line, text)) lines.push_back(line);
    }
    return lines;
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
};

TEST_F(ObservabilityTest, WorkersServeMetricsWhereTheyRegisteredThem) {
  StartCluster("metrics-where");
  absl::StatusOr<v1::ListWorkersResponse> listed =
      cli::ListWorkers(cluster_->control_address(), v1::WORKER_ROLE_UNSPECIFIED,
                       absl::Seconds(5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->workers_size(), 2);
  for (const v1::WorkerInfo& w : listed->workers()) {
    ASSERT_FALSE(w.metrics_address().empty()) << w.worker_id();
    // The registered address is the one the worker wrote to its port file.
    EXPECT_EQ(w.metrics_address(),
              cluster_->Find(w.worker_id())->metrics_address);
    absl::StatusOr<double> draining =
        testing::ScrapeSum(w.metrics_address(), "pdserve_worker_draining",
                           {{"worker_id", w.worker_id()}});
    ASSERT_TRUE(draining.ok()) << draining.status();
    EXPECT_EQ(*draining, 0);
    absl::StatusOr<double> capacity = testing::ScrapeSum(
        w.metrics_address(), "pdserve_kv_cache_capacity_blocks");
    ASSERT_TRUE(capacity.ok()) << capacity.status();
    EXPECT_EQ(*capacity, w.load().total_kv_blocks());
  }
  // The router counts them by pool on its HTTP port.
  const std::string router = cluster_->Find("router")->metrics_address;
  for (const char* pool : {"prefill", "decode"}) {
    absl::StatusOr<double> serving = testing::ScrapeSum(
        router, "pdserve_workers", {{"pool", pool}, {"state", "serving"}});
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_EQ(*serving, 1) << pool;
  }
}

TEST_F(ObservabilityTest, ARequestIdReachesEveryProcessAndItsLogLines) {
  // Request lifecycle lines are DEBUG; the processes inherit the level.
  ASSERT_EQ(::setenv("PDSERVE_LOG_LEVEL", "debug", 1), 0);
  StartCluster("request-ids");
  ::unsetenv("PDSERVE_LOG_LEVEL");

  // HTTP: the header becomes the request's id and comes back.
  const std::string http_id = "trace-http-7f3a";
  httplib::Client http(cluster_->http_url());
  http.set_read_timeout(60);
  httplib::Result answer = http.Post(
      "/v1/completions", {{"x-request-id", http_id}},
      R"({"prompt": [5, 6, 7, 8], "max_tokens": 4})", "application/json");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  ASSERT_EQ(answer->status, 200) << answer->body;
  EXPECT_EQ(answer->get_header_value("x-request-id"), http_id);

  // gRPC: the metadata entry, echoed in the initial metadata and on every
  // chunk.
  const std::string grpc_id = "trace-grpc-91c2";
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(
      cluster_->router_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("x-request-id", grpc_id);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  v1::GenerateRequest request;
  for (uint32_t t : {9, 10, 11, 12}) request.mutable_token_ids()->add_ids(t);
  request.mutable_sampling()->set_max_tokens(4);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    ++chunks;
    EXPECT_EQ(chunk.request_id(), grpc_id);
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GT(chunks, 0);
  const auto& initial = context.GetServerInitialMetadata();
  auto echoed = initial.find("x-request-id");
  ASSERT_NE(echoed, initial.end());
  EXPECT_EQ(std::string(echoed->second.data(), echoed->second.size()), grpc_id);

  // Each process logged the request's steps under its id: the router its
  // arrival, route and end; the prefill worker the queue, the compute and
  // the transfer; the decode worker the admission, the verified transfer,
  // the decode and its end.
  for (const std::string& id : {http_id, grpc_id}) {
    const std::vector<std::string> router = LogLines("router", id);
    EXPECT_THAT(router, Contains(HasSubstr("received")));
    EXPECT_THAT(router, Contains(HasSubstr("prefill on prefill-0")));
    EXPECT_THAT(router, Contains(HasSubstr("ended (ok)")));
    const std::vector<std::string> prefill = LogLines("prefill-0", id);
    EXPECT_THAT(prefill, Contains(HasSubstr("queued for prefill")));
    EXPECT_THAT(prefill, Contains(HasSubstr("prefilled")));
    EXPECT_THAT(prefill, Contains(HasSubstr("complete")));
    const std::vector<std::string> decode = LogLines("decode-0", id);
    EXPECT_THAT(decode, Contains(HasSubstr("admitted")));
    EXPECT_THAT(decode, Contains(HasSubstr("verified")));
    EXPECT_THAT(decode, Contains(HasSubstr("decoding")));
    EXPECT_THAT(decode, Contains(HasSubstr("decode ended")));
  }

  // Without a header the router makes an id, and says which.
  httplib::Result anonymous =
      http.Post("/v1/completions", R"({"prompt": [5, 6], "max_tokens": 2})",
                "application/json");
  ASSERT_TRUE(anonymous);
  EXPECT_THAT(anonymous->get_header_value("x-request-id"),
              MatchesRegex("[0-9a-f]{32}"));
  // An id unfit for a header or a log line is refused, not echoed.
  httplib::Result bad =
      http.Post("/v1/completions", {{"x-request-id", std::string(129, 'a')}},
                R"({"prompt": [5, 6], "max_tokens": 2})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_EQ(bad->get_header_value("x-request-id"), "");
}

}  // namespace
}  // namespace pdserve
