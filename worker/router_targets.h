// RouterTargets: which routers a worker registers with, from --router.
//
// --router takes either a comma-separated list of host:port
// ("10.0.0.1:50051,10.0.0.2:50051"), or "dns:///NAME:PORT": NAME is
// resolved (getaddrinfo) to every address it has, and the worker registers
// with each of them. The DNS form fits a Kubernetes headless Service, whose
// name resolves to every router pod; the worker re-resolves it
// periodically (router_membership.h), so routers that come and go are
// followed.
//
// Failure contract: ParseRouterTargets refuses a malformed flag
// (INVALID_ARGUMENT naming the entry); ResolveRouterTargets answers
// UNAVAILABLE when a DNS name does not resolve (yet): the caller keeps the
// routers it has and tries again later.
// Thread-safety: plain values and functions.
#ifndef PDSERVE_WORKER_ROUTER_TARGETS_H_
#define PDSERVE_WORKER_ROUTER_TARGETS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::worker {

struct RouterTargets {
  // The list form: the addresses as given, without duplicates, in order.
  std::vector<std::string> addresses;
  // The DNS form: the name to resolve and the routers' port.
  std::string dns_name;
  int dns_port = 0;

  bool is_dns() const { return !dns_name.empty(); }
};

// Empty flag: no routers (the worker runs standalone).
absl::StatusOr<RouterTargets> ParseRouterTargets(absl::string_view flag);

// Every address of `host`, as text ("10.0.0.1", "::1"); UNAVAILABLE when
// it has none. The default resolves with getaddrinfo; tests pass their own.
using HostResolver =
    std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);

// The router addresses to register with now: the list form's addresses,
// or the DNS name's addresses with the port ("[v6]:port" for IPv6),
// sorted and without duplicates.
absl::StatusOr<std::vector<std::string>> ResolveRouterTargets(
    const RouterTargets& targets, const HostResolver& resolve = ResolveHost);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_ROUTER_TARGETS_H_
