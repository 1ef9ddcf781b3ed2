#include "kv_transfer/transport_factory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::kv_transfer {
namespace {

using ::testing::HasSubstr;

TEST(TransportFactoryTest, ParsesTheNamesOperatorsUse) {
  EXPECT_EQ(*ParseTransportKind("ucx"), v1::TRANSPORT_KIND_UCX);
  EXPECT_EQ(*ParseTransportKind("NCCL"), v1::TRANSPORT_KIND_NCCL);
  EXPECT_EQ(*ParseTransportKind("in-process"), v1::TRANSPORT_KIND_IN_PROCESS);
  absl::StatusOr<v1::TransportKind> bad = ParseTransportKind("rdma");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("ucx, nccl"));
}

TEST(TransportFactoryTest, CreatesTheConfiguredBackend) {
  for (v1::TransportKind kind :
       {v1::TRANSPORT_KIND_UCX, v1::TRANSPORT_KIND_IN_PROCESS}) {
    KvTransportConfig config;
    config.kind = kind;
    absl::StatusOr<std::unique_ptr<KvTransport>> transport =
        CreateKvTransport(config);
    ASSERT_TRUE(transport.ok()) << transport.status();
    EXPECT_EQ((*transport)->kind(), kind);
  }
}

TEST(TransportFactoryTest, NcclIsAClearErrorWhenNotLinked) {
  // This test binary does not link //kv_transfer:nccl_backend: asking for
  // NCCL must fail loudly, never fall back to another transport.
  KvTransportConfig config;
  config.kind = v1::TRANSPORT_KIND_NCCL;
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      CreateKvTransport(config);
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(transport.status().message()),
              HasSubstr("not built into this binary"));
}

TEST(TransportFactoryTest, WrapsInFaultInjectionWhenAsked) {
  KvTransportConfig config;
  config.kind = v1::TRANSPORT_KIND_IN_PROCESS;
  TransportFaults faults;
  faults.drop_notices = true;
  config.faults = faults;
  auto transport = CreateKvTransport(config);
  ASSERT_TRUE(transport.ok());
  EXPECT_NE(dynamic_cast<FaultInjectingTransport*>(transport->get()), nullptr);
  EXPECT_EQ((*transport)->kind(), v1::TRANSPORT_KIND_IN_PROCESS);
}

TEST(TransportFactoryTest, ParsesFaultLists) {
  absl::StatusOr<TransportFaults> faults =
      ParseTransportFaults("corrupt_writes,delay_ms=250,fail_after_bytes=4096");
  ASSERT_TRUE(faults.ok()) << faults.status();
  EXPECT_TRUE(faults->corrupt_writes);
  EXPECT_FALSE(faults->drop_writes);
  EXPECT_FALSE(faults->drop_notices);
  EXPECT_EQ(faults->delay, absl::Milliseconds(250));
  EXPECT_EQ(faults->fail_after_bytes, 4096u);
  EXPECT_TRUE(ParseTransportFaults("drop_writes")->drop_writes);
  EXPECT_TRUE(ParseTransportFaults("drop_notices")->drop_notices);
  EXPECT_FALSE(ParseTransportFaults("")->fail_after_bytes.has_value());
  for (const char* bad :
       {"delay_ms", "delay_ms=soon", "drop_writes=1", "melt_cables"}) {
    const absl::Status status = ParseTransportFaults(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad));
  }
}

}  // namespace
}  // namespace pdserve::kv_transfer
