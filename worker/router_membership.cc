#include "worker/router_membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/log.h"

namespace pdserve::worker {

absl::StatusOr<std::unique_ptr<RouterMembership>> RouterMembership::Start(
    RouterMembershipOptions options) {
  if (!options.targets.is_dns() && options.targets.addresses.empty()) {
    return absl::InvalidArgumentError("membership: no router address");
  }
  if (!options.session.report_status || !options.session.on_drain) {
    return absl::InvalidArgumentError("membership: callbacks are required");
  }
  auto membership = std::unique_ptr<RouterMembership>(
      new RouterMembership(std::move(options)));
  const RouterTargets& targets = membership->options_.targets;
  if (!targets.is_dns()) {
    membership->Update(targets.addresses);
    return membership;
  }
  absl::StatusOr<std::vector<std::string>> resolved =
      ResolveRouterTargets(targets, membership->options_.resolve);
  if (resolved.ok()) {
    membership->Update(*resolved);
  } else {
    PD_LOG(WARNING) << "--router: " << resolved.status()
                    << "; trying again every "
                    << absl::FormatDuration(
                           membership->options_.resolve_interval);
  }
  membership->resolver_ =
      std::thread([m = membership.get()] { m->ResolveLoop(); });
  return membership;
}

RouterMembership::~RouterMembership() { Stop("shutdown"); }

void RouterMembership::ResolveLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      mutex_.AwaitWithTimeout(absl::Condition(&stopping_),
                              options_.resolve_interval);
      if (stopping_) return;
    }
    absl::StatusOr<std::vector<std::string>> resolved =
        ResolveRouterTargets(options_.targets, options_.resolve);
    if (!resolved.ok()) {
      // Keep the routers we have: a DNS hiccup must not deregister the
      // worker everywhere.
      PD_LOG(WARNING) << "--router: " << resolved.status()
                      << "; keeping the current routers";
      continue;
    }
    Update(*resolved);
  }
}

void RouterMembership::Update(const std::vector<std::string>& addresses) {
  std::vector<std::unique_ptr<MembershipClient>> dropped;
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (std::find(addresses.begin(), addresses.end(), it->first) ==
          addresses.end()) {
        PD_LOG(INFO) << "router " << it->first
                     << " no longer listed; leaving it";
        dropped.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& address : addresses) {
      if (sessions_.contains(address)) continue;
      MembershipClientOptions session = options_.session;
      session.router_address = address;
      session.prefix_cache_feed = options_.prefix_cache_feed;
      absl::StatusOr<std::unique_ptr<MembershipClient>> client =
          MembershipClient::Start(std::move(session));
      if (!client.ok()) {
        PD_LOG(ERROR) << "router " << address << ": " << client.status();
        continue;
      }
      PD_LOG(INFO) << "registering with router " << address;
      sessions_[address] = std::move(client).value();
    }
  }
  // Outside the lock: each deregisters, which may take the rpc timeout.
  for (auto& session : dropped) session->Stop("router left the list");
}

void RouterMembership::Stop(const std::string& reason) {
  std::map<std::string, std::unique_ptr<MembershipClient>> sessions;
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
    sessions.swap(sessions_);
  }
  if (resolver_.joinable()) resolver_.join();
  // At once, so that a dead router's deregister timeout does not delay the
  // others'.
  std::vector<std::thread> stoppers;
  for (auto& [address, session] : sessions) {
    stoppers.emplace_back([&reason, s = session.get()] { s->Stop(reason); });
  }
  for (std::thread& t : stoppers) t.join();
}

std::vector<std::string> RouterMembership::routers() {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> out;
  for (const auto& [address, session] : sessions_) out.push_back(address);
  return out;
}

int RouterMembership::registered_count() {
  absl::MutexLock lock(&mutex_);
  int n = 0;
  for (const auto& [address, session] : sessions_) n += session->registered();
  return n;
}

}  // namespace pdserve::worker
