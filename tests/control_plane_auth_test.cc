// The authenticated control plane on a real local cluster (pd-router,
// pd-prefill-worker, pd-decode-worker as processes, all started with a
// token file): forged control calls (no token, a wrong token) are refused
// with UNAUTHENTICATED and change nothing (the router's worker list and
// drain states, the decode worker's free KV blocks, the routing policy);
// the cluster still serves; the same calls with the cluster's token (here
// the file's SECOND line, as during a rotation) reach their handlers.
// Prints the forged-call table.
#include "rpc/control_plane_auth.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/generate_client.h"
#include "cli/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/admin.grpc.pb.h"
#include "proto/membership.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/cluster_credential.h"
#include "tests/cluster_testing.h"

namespace pdserve {
namespace {

// The file every process gets: they present the first line; the test's
// "right" calls present the second, which servers must accept too.
constexpr char kNewToken[] = "pdserve-test-token-new-6f1d2c";
constexpr char kOldToken[] = "pdserve-test-token-old-93ab47";

// What a forged call must not change, as the router and workers report it.
struct ClusterSnapshot {
  std::vector<std::string> workers;  // "id STATE", sorted
  uint32_t decode_free_blocks = 0;
  std::string policy;

  bool operator==(const ClusterSnapshot& o) const {
    return workers == o.workers && decode_free_blocks == o.decode_free_blocks &&
           policy == o.policy;
  }
  std::string ToString() const {
    return absl::StrCat("[", absl::StrJoin(workers, ", "), "] free blocks ",
                        decode_free_blocks, " policy ", policy);
  }
};

struct ForgedRow {
  std::string call;
  std::string credential;
  grpc::StatusCode code;
  bool changed;
};

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    default:
      return absl::StrCat("code ", static_cast<int>(code));
  }
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
}

class ControlPlaneAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.bin_dir = testing::BinDir();
    options_.work_dir = testing::MakeWorkDir("control_plane_auth");
    options_.model_path = testing::TinyModelPath();
    options_.worker_args = testing::SmallWorkerArgs();
    // Long enough that the fake worker registered below outlives the checks
    // made on it before it deregisters.
    options_.lease = absl::Seconds(5);
    options_.heartbeat = absl::Milliseconds(200);
    options_.cluster_token_file = options_.work_dir + "/cluster-token";
    std::ofstream(options_.cluster_token_file) << kNewToken << "\n"
                                               << kOldToken << "\n";
    absl::StatusOr<std::unique_ptr<cli::LocalCluster>> cluster =
        cli::LocalCluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);

    right_ = *rpc::ClusterCredential::FromText(kOldToken, "test");
    wrong_ = *rpc::ClusterCredential::FromText("not-the-cluster-token", "t");
    absl::StatusOr<v1::ListWorkersResponse> listed =
        cli::ListWorkers(cluster_->control_address(),
                         v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5), right_);
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const v1::WorkerInfo& w : listed->workers()) {
      if (w.role() == v1::WORKER_ROLE_DECODE) decode_ = w;
      if (w.role() == v1::WORKER_ROLE_PREFILL) prefill_ = w;
    }
    ASSERT_EQ(decode_.worker_id(), "decode-0");
    ASSERT_EQ(prefill_.worker_id(), "prefill-0");
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    }
  }

  // The state after the heartbeats in flight have landed (a forged call
  // that reserved blocks would show in the next heartbeat's load).
  ClusterSnapshot Snapshot() {
    absl::SleepFor(absl::Milliseconds(500));
    ClusterSnapshot s;
    absl::StatusOr<v1::ListWorkersResponse> listed =
        cli::ListWorkers(cluster_->control_address(),
                         v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5), right_);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (listed.ok()) {
      for (const v1::WorkerInfo& w : listed->workers()) {
        s.workers.push_back(
            absl::StrCat(w.worker_id(), " ", v1::WorkerState_Name(w.state())));
        if (w.worker_id() == "decode-0") {
          s.decode_free_blocks = w.load().free_kv_blocks();
        }
      }
    }
    std::sort(s.workers.begin(), s.workers.end());
    absl::StatusOr<v1::GetRoutingPolicyResponse> policy = cli::GetRoutingPolicy(
        cluster_->control_address(), absl::Seconds(5), right_);
    EXPECT_TRUE(policy.ok()) << policy.status();
    if (policy.ok())
      s.policy = v1::RoutingPolicy_Name(policy->config().policy());
    return s;
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                         const rpc::ClusterCredential& c) {
    return rpc::NewControlPlaneChannel(address, c);
  }

  // The forged calls, each with the credential it presents.
  grpc::Status Register(const rpc::ClusterCredential& c,
                        std::string* lease = nullptr) {
    v1::RegisterRequest request;
    request.set_worker_id("fake-decode");
    request.set_instance_id("fake-decode@1");
    request.set_role(v1::WORKER_ROLE_DECODE);
    request.set_grpc_address("127.0.0.1:1");
    *request.mutable_model() = decode_.model();
    for (int t : decode_.transports()) {
      request.add_transports(static_cast<v1::TransportKind>(t));
    }
    v1::RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status status =
        v1::Membership::NewStub(Channel(cluster_->control_address(), c))
            ->Register(&context, request, &response);
    if (lease != nullptr) *lease = response.lease_id();
    return status;
  }

  grpc::Status Heartbeat(const rpc::ClusterCredential& c) {
    v1::HeartbeatRequest request;
    request.set_lease_id("forged-lease");
    request.set_worker_id("decode-0");
    request.set_state(v1::WORKER_STATE_DRAINING);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::Membership::NewStub(Channel(cluster_->control_address(), c))
        ->Heartbeat(&context, request, &response);
  }

  grpc::Status Deregister(const rpc::ClusterCredential& c,
                          const std::string& worker_id,
                          const std::string& lease) {
    v1::DeregisterRequest request;
    request.set_lease_id(lease);
    request.set_worker_id(worker_id);
    request.set_reason("forged");
    v1::DeregisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::Membership::NewStub(Channel(cluster_->control_address(), c))
        ->Deregister(&context, request, &response);
  }

  grpc::Status Drain(const rpc::ClusterCredential& c,
                     const std::string& worker_id) {
    v1::DrainWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_deadline_ms(1000);
    v1::DrainWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::Admin::NewStub(Channel(cluster_->control_address(), c))
        ->DrainWorker(&context, request, &response);
  }

  grpc::Status SetPolicy(const rpc::ClusterCredential& c,
                         v1::RoutingPolicy policy) {
    v1::SetRoutingPolicyRequest request;
    request.mutable_config()->set_policy(policy);
    v1::SetRoutingPolicyResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::Admin::NewStub(Channel(cluster_->control_address(), c))
        ->SetRoutingPolicy(&context, request, &response);
  }

  grpc::Status List(const rpc::ClusterCredential& c) {
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::Admin::NewStub(Channel(cluster_->control_address(), c))
        ->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  }

  // Reserves blocks for 64 tokens on the decode worker.
  grpc::Status Admit(const rpc::ClusterCredential& c,
                     v1::KvTransferTarget* target = nullptr) {
    v1::AdmitRequest request;
    request.set_request_id("forged-admit");
    request.set_attempt(1);
    for (uint32_t t = 0; t < 64; ++t) request.add_token_ids(10 + t);
    request.set_num_prompt_tokens(64);
    *request.mutable_writer_layout() = prefill_.model().kv_layout();
    for (int t : prefill_.transports()) {
      request.add_writer_transports(static_cast<v1::TransportKind>(t));
    }
    request.set_prefill_worker_id("prefill-0");
    request.set_reservation_timeout_ms(60000);
    v1::AdmitResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status status =
        v1::DecodeWorker::NewStub(Channel(decode_.grpc_address(), c))
            ->Admit(&context, request, &response);
    if (target != nullptr) *target = response.target();
    return status;
  }

  grpc::Status Release(const rpc::ClusterCredential& c,
                       const std::string& transfer_id) {
    v1::ReleaseRequest request;
    request.set_transfer_id(transfer_id);
    request.set_request_id("forged-admit");
    request.set_writes_quiesced(true);
    request.set_reason("forged");
    v1::ReleaseResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::DecodeWorker::NewStub(Channel(decode_.grpc_address(), c))
        ->Release(&context, request, &response);
  }

  // A local-prefill decode on the decode worker: would take blocks and run.
  grpc::Status StartDecode(const rpc::ClusterCredential& c) {
    v1::StartDecodeRequest request;
    request.set_request_id("forged-decode");
    request.set_attempt(1);
    for (uint32_t t = 0; t < 32; ++t) {
      request.mutable_local_prefill()->add_prompt_token_ids(10 + t);
    }
    request.mutable_sampling()->set_max_tokens(4);
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = v1::DecodeWorker::NewStub(Channel(decode_.grpc_address(), c))
                      ->StartDecode(&context, request);
    v1::DecodeChunk chunk;
    while (stream->Read(&chunk)) {
    }
    return stream->Finish();
  }

  // A prefill whose KV would be written into a target the caller made up.
  grpc::Status Prefill(const rpc::ClusterCredential& c) {
    v1::PrefillRequest request;
    request.set_request_id("forged-prefill");
    request.set_attempt(1);
    for (uint32_t t = 0; t < 32; ++t) request.add_prompt_token_ids(10 + t);
    v1::KvTransferTarget* target = request.mutable_target();
    target->set_transfer_id("decode-0/999999");
    target->set_request_id("forged-prefill");
    target->set_decode_worker_id("decode-0");
    target->set_notify_address("127.0.0.1:1");
    *target->mutable_layout() = decode_.model().kv_layout();
    for (uint32_t b = 0; b < 2; ++b) target->add_block_ids(b);
    target->set_num_tokens(32);
    target->set_expires_in_ms(60000);
    v1::PrefillResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::PrefillWorker::NewStub(Channel(prefill_.grpc_address(), c))
        ->Prefill(&context, request, &response);
  }

  grpc::Status CancelPrefill(const rpc::ClusterCredential& c) {
    v1::CancelRequest request;
    request.set_request_id("forged-prefill");
    request.set_attempt(1);
    v1::CancelResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return v1::PrefillWorker::NewStub(Channel(prefill_.grpc_address(), c))
        ->Cancel(&context, request, &response);
  }

  cli::LocalClusterOptions options_;
  std::unique_ptr<cli::LocalCluster> cluster_;
  const rpc::ClusterCredential none_;  // auth off: presents nothing
  rpc::ClusterCredential right_;
  rpc::ClusterCredential wrong_;
  v1::WorkerInfo decode_;
  v1::WorkerInfo prefill_;
};

std::string FormatTable(const std::vector<ForgedRow>& rows) {
  std::string out = absl::StrFormat("%-35s %-17s %-16s %s\n", "CALL",
                                    "CREDENTIAL", "STATUS", "CHANGED?");
  for (const ForgedRow& r : rows) {
    absl::StrAppendFormat(&out, "%-35s %-17s %-16s %s\n", r.call, r.credential,
                          CodeName(r.code), r.changed ? "yes" : "no");
  }
  return out;
}

TEST_F(ControlPlaneAuthTest, ForgedCallsAreRefusedAndChangeNothing) {
  const ClusterSnapshot before = Snapshot();
  ASSERT_EQ(before.workers,
            (std::vector<std::string>{"decode-0 WORKER_STATE_SERVING",
                                      "prefill-0 WORKER_STATE_SERVING"}));
  ASSERT_GT(before.decode_free_blocks, 0u);

  const std::vector<std::pair<
      std::string, std::function<grpc::Status(const rpc::ClusterCredential&)>>>
      calls = {
          {"Membership.Register(fake-decode)",
           [&](const auto& c) { return Register(c); }},
          {"Membership.Heartbeat(DRAINING)",
           [&](const auto& c) { return Heartbeat(c); }},
          {"Membership.Deregister(decode-0)",
           [&](const auto& c) {
             return Deregister(c, "decode-0", "forged-lease");
           }},
          {"Admin.DrainWorker(decode-0)",
           [&](const auto& c) { return Drain(c, "decode-0"); }},
          {"Admin.SetRoutingPolicy(rr)",
           [&](const auto& c) {
             return SetPolicy(c, v1::ROUTING_POLICY_ROUND_ROBIN);
           }},
          {"Admin.ListWorkers", [&](const auto& c) { return List(c); }},
          {"DecodeWorker.Admit(64 tokens)",
           [&](const auto& c) { return Admit(c); }},
          {"DecodeWorker.StartDecode(local)",
           [&](const auto& c) { return StartDecode(c); }},
          {"DecodeWorker.Release",
           [&](const auto& c) { return Release(c, "decode-0/1"); }},
          {"PrefillWorker.Prefill(fake target)",
           [&](const auto& c) { return Prefill(c); }},
          {"PrefillWorker.Cancel",
           [&](const auto& c) { return CancelPrefill(c); }},
      };
  std::vector<ForgedRow> rows;
  for (const auto& [name, call] : calls) {
    for (const auto& [label, credential] :
         {std::pair<std::string, const rpc::ClusterCredential*>{"none", &none_},
          {"wrong token", &wrong_}}) {
      const grpc::Status status = call(*credential);
      const ClusterSnapshot after = Snapshot();
      rows.push_back({name, label, status.error_code(), !(after == before)});
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << name << " with " << label << ": " << status.error_message();
      EXPECT_EQ(status.error_message().find(kNewToken), std::string::npos);
      EXPECT_EQ(status.error_message().find(kOldToken), std::string::npos);
      EXPECT_TRUE(after == before)
          << name << " with " << label
          << " changed the cluster: " << before.ToString() << " -> "
          << after.ToString();
    }
  }

  // The cluster still serves (its own processes present the first line).
  v1::GenerateRequest generate;
  generate.set_text("hello there");
  generate.mutable_sampling()->set_max_tokens(4);
  generate.mutable_sampling()->set_temperature(0);
  int chunks = 0;
  const absl::Status served = cli::StreamGenerate(
      cluster_->router_address(), generate, absl::Seconds(30),
      [&](const v1::GenerateResponse&) { ++chunks; });
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_GT(chunks, 0);

  // With the cluster's token (the file's second line: a rotation), the same
  // calls reach their handlers and act.
  std::string lease;
  grpc::Status status = Register(right_, &lease);
  rows.push_back({"Membership.Register(fake-decode)", "right (2nd line)",
                  status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();
  ClusterSnapshot now = Snapshot();
  EXPECT_NE(std::find(now.workers.begin(), now.workers.end(),
                      "fake-decode WORKER_STATE_STARTING"),
            now.workers.end())
      << now.ToString();

  status = Drain(right_, "fake-decode");
  rows.push_back({"Admin.DrainWorker(fake-decode)", "right (2nd line)",
                  status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();
  now = Snapshot();
  EXPECT_NE(std::find(now.workers.begin(), now.workers.end(),
                      "fake-decode WORKER_STATE_DRAINING"),
            now.workers.end())
      << now.ToString();

  status = Deregister(right_, "fake-decode", lease);
  rows.push_back({"Membership.Deregister(fake-decode)", "right (2nd line)",
                  status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();

  status = Heartbeat(right_);
  rows.push_back({"Membership.Heartbeat(DRAINING)", "right (2nd line)",
                  status.error_code(), false});
  // Past the door: the made-up lease is unknown.
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();

  v1::KvTransferTarget target;
  status = Admit(right_, &target);
  rows.push_back({"DecodeWorker.Admit(64 tokens)", "right (2nd line)",
                  status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();
  now = Snapshot();
  // The snapshot sees a reservation: the unchanged free blocks above are
  // evidence, not a blind spot.
  EXPECT_LT(now.decode_free_blocks, before.decode_free_blocks);
  status = Release(right_, target.transfer_id());
  rows.push_back(
      {"DecodeWorker.Release", "right (2nd line)", status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();

  status = SetPolicy(right_, v1::ROUTING_POLICY_ROUND_ROBIN);
  rows.push_back({"Admin.SetRoutingPolicy(rr)", "right (2nd line)",
                  status.error_code(), true});
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Snapshot().policy, "ROUTING_POLICY_ROUND_ROBIN");

  // Presenting the first line works as well.
  absl::StatusOr<rpc::ClusterCredential> first =
      rpc::ClusterCredential::FromText(kNewToken, "test");
  status = List(*first);
  rows.push_back(
      {"Admin.ListWorkers", "right (1st line)", status.error_code(), false});
  EXPECT_TRUE(status.ok()) << status.error_message();

  std::printf(
      "\nforged-call table (control plane with --cluster_token_file)"
      "\n%s\n",
      FormatTable(rows).c_str());
  std::fflush(stdout);

  // No process logged a token.
  for (const cli::LocalProcess& p : cluster_->processes()) {
    std::ifstream log(p.log_path);
    std::stringstream text;
    text << log.rdbuf();
    EXPECT_EQ(text.str().find(kNewToken), std::string::npos) << p.name;
    EXPECT_EQ(text.str().find(kOldToken), std::string::npos) << p.name;
  }
}

}  // namespace
}  // namespace pdserve
