#include "worker/router_targets.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(ParseRouterTargetsTest, ListKeepsOrderAndDropsDuplicates) {
  absl::StatusOr<RouterTargets> t =
      ParseRouterTargets("127.0.0.1:1, 127.0.0.1:2,127.0.0.1:1,[::1]:3");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->is_dns());
  EXPECT_THAT(t->addresses,
              ElementsAre("127.0.0.1:1", "127.0.0.1:2", "[::1]:3"));
}

TEST(ParseRouterTargetsTest, OneAddressIsAListOfOne) {
  absl::StatusOr<RouterTargets> t = ParseRouterTargets("localhost:50051");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->addresses, ElementsAre("localhost:50051"));
}

TEST(ParseRouterTargetsTest, EmptyMeansStandalone) {
  absl::StatusOr<RouterTargets> t = ParseRouterTargets("");
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(t->addresses, IsEmpty());
  EXPECT_FALSE(t->is_dns());
}

TEST(ParseRouterTargetsTest, DnsForm) {
  absl::StatusOr<RouterTargets> t =
      ParseRouterTargets("dns:///pdserve-router-control.ns.svc:50051");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->is_dns());
  EXPECT_EQ(t->dns_name, "pdserve-router-control.ns.svc");
  EXPECT_EQ(t->dns_port, 50051);
  EXPECT_THAT(t->addresses, IsEmpty());
}

TEST(ParseRouterTargetsTest, RefusesMalformedEntries) {
  for (const char* bad :
       {"127.0.0.1", "127.0.0.1:", ":50051", "a:1,,b:2", "a:0", "a:70000",
        "a:x", "dns:///name", "dns:///name:0", "dns:///:1", "dns:///a:1,b:2"}) {
    EXPECT_EQ(ParseRouterTargets(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(ResolveRouterTargetsTest, ListIsReturnedAsIs) {
  RouterTargets t = *ParseRouterTargets("b:1,a:2");
  bool called = false;
  absl::StatusOr<std::vector<std::string>> r =
      ResolveRouterTargets(t, [&](const std::string&) {
        called = true;
        return absl::StatusOr<std::vector<std::string>>(
            std::vector<std::string>{});
      });
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, ElementsAre("b:1", "a:2"));
  EXPECT_FALSE(called);
}

TEST(ResolveRouterTargetsTest, DnsNameGivesEveryAddressWithThePort) {
  RouterTargets t = *ParseRouterTargets("dns:///routers:7000");
  absl::StatusOr<std::vector<std::string>> r =
      ResolveRouterTargets(t, [](const std::string& host) {
        EXPECT_EQ(host, "routers");
        return absl::StatusOr<std::vector<std::string>>(
            std::vector<std::string>{"10.0.0.2", "10.0.0.1", "fd00::1",
                                     "10.0.0.2"});
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r,
              ElementsAre("10.0.0.1:7000", "10.0.0.2:7000", "[fd00::1]:7000"));
}

TEST(ResolveRouterTargetsTest, UnresolvableNameIsUnavailable) {
  RouterTargets t = *ParseRouterTargets("dns:///routers:7000");
  EXPECT_EQ(
      ResolveRouterTargets(t,
                           [](const std::string&) {
                             return absl::StatusOr<std::vector<std::string>>(
                                 absl::UnavailableError("no such host"));
                           })
          .status()
          .code(),
      absl::StatusCode::kUnavailable);
}

TEST(ResolveHostTest, RealResolverFindsLoopback) {
  absl::StatusOr<std::vector<std::string>> r = ResolveHost("127.0.0.1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, ElementsAre("127.0.0.1"));
  absl::StatusOr<std::vector<std::string>> localhost = ResolveHost("localhost");
  ASSERT_TRUE(localhost.ok()) << localhost.status();
  EXPECT_FALSE(localhost->empty());
  EXPECT_EQ(ResolveHost("no-such-host.invalid").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve::worker
