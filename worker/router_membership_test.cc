#include "worker/router_membership.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A DNS name whose addresses the test changes.
class FakeDns {
 public:
  void Set(absl::StatusOr<std::vector<std::string>> hosts) {
    absl::MutexLock lock(&mutex_);
    hosts_ = std::move(hosts);
  }
  absl::StatusOr<std::vector<std::string>> Resolve(const std::string&) {
    absl::MutexLock lock(&mutex_);
    return hosts_;
  }

 private:
  absl::Mutex mutex_;
  absl::StatusOr<std::vector<std::string>> hosts_ =
      absl::UnavailableError("not yet");
};

RouterMembershipOptions Options(const std::string& flag) {
  RouterMembershipOptions options;
  options.targets = *ParseRouterTargets(flag);
  options.session.registration.set_worker_id("w");
  options.session.report_status = [] { return WorkerStatusReport(); };
  options.session.on_drain = [](absl::Duration) {};
  options.session.rpc_timeout = absl::Milliseconds(100);
  options.resolve_interval = absl::Milliseconds(20);
  return options;
}

// Waits (up to 10 s) until the sessions are `expected`.
bool AwaitRouters(RouterMembership& m, const std::vector<std::string>& want) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (m.routers() != want) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(RouterMembershipTest, ListGetsOneSessionPerRouter) {
  // Nothing listens there: sessions retry on their own, Stop is prompt.
  auto m = RouterMembership::Start(Options("127.0.0.1:1,127.0.0.1:2"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT((*m)->routers(), ElementsAre("127.0.0.1:1", "127.0.0.1:2"));
  EXPECT_EQ((*m)->registered_count(), 0);
  const absl::Time start = absl::Now();
  (*m)->Stop("test");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_THAT((*m)->routers(), IsEmpty());
}

TEST(RouterMembershipTest, DnsNameIsFollowedAsItChanges) {
  FakeDns dns;
  RouterMembershipOptions options = Options("dns:///routers:7");
  options.resolve = [&dns](const std::string& host) {
    return dns.Resolve(host);
  };
  // Not resolvable at start: no error, no session; tried again.
  auto m = RouterMembership::Start(std::move(options));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT((*m)->routers(), IsEmpty());
  dns.Set(std::vector<std::string>{"127.0.0.1", "127.0.0.2"});
  EXPECT_TRUE(AwaitRouters(**m, {"127.0.0.1:7", "127.0.0.2:7"}));
  // A router pod goes, another comes.
  dns.Set(std::vector<std::string>{"127.0.0.2", "127.0.0.3"});
  EXPECT_TRUE(AwaitRouters(**m, {"127.0.0.2:7", "127.0.0.3:7"}));
  // A failed lookup keeps the routers we have.
  dns.Set(absl::UnavailableError("SERVFAIL"));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_THAT((*m)->routers(), ElementsAre("127.0.0.2:7", "127.0.0.3:7"));
  (*m)->Stop("test");
}

TEST(RouterMembershipTest, RefusesNoRouterOrNoCallbacks) {
  EXPECT_EQ(RouterMembership::Start(Options("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  RouterMembershipOptions options = Options("127.0.0.1:1");
  options.session.on_drain = nullptr;
  EXPECT_EQ(RouterMembership::Start(std::move(options)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::worker
