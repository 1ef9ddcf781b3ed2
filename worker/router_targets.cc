#include "worker/router_targets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdserve::worker {
namespace {

constexpr absl::string_view kDnsScheme = "dns:///";

bool ValidPort(absl::string_view text, int* port) {
  return absl::SimpleAtoi(text, port) && *port > 0 && *port <= 65535;
}

// "host:port" or "[v6]:port" with a host and a valid port.
bool ValidHostPort(absl::string_view entry) {
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int port = 0;
  return ValidPort(entry.substr(colon + 1), &port);
}

}  // namespace

absl::StatusOr<RouterTargets> ParseRouterTargets(absl::string_view flag) {
  RouterTargets targets;
  flag = absl::StripAsciiWhitespace(flag);
  if (flag.empty()) return targets;
  if (absl::ConsumePrefix(&flag, kDnsScheme)) {
    const size_t colon = flag.rfind(':');
    if (colon == absl::string_view::npos || colon == 0 ||
        !ValidPort(flag.substr(colon + 1), &targets.dns_port) ||
        absl::StrContains(flag, ',')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--router: expected dns:///NAME:PORT, got '", kDnsScheme, flag, "'"));
    }
    targets.dns_name = std::string(flag.substr(0, colon));
    return targets;
  }
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!ValidHostPort(entry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--router: '", entry,
          "' is not host:port (a list is host:port,host:port; a DNS name "
          "is dns:///NAME:PORT)"));
    }
    if (std::find(targets.addresses.begin(), targets.addresses.end(), entry) ==
        targets.addresses.end()) {
      targets.addresses.emplace_back(entry);
    }
  }
  return targets;
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(error)));
  }
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        a->ai_family == AF_INET
            ? static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)
                       ->sin6_addr);
    if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) &&
        ::inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) {
      addresses.emplace_back(text);
    }
  }
  ::freeaddrinfo(found);
  if (addresses.empty()) {
    return absl::UnavailableError(
        absl::StrCat("'", host, "' has no IPv4 or IPv6 address"));
  }
  return addresses;
}

absl::StatusOr<std::vector<std::string>> ResolveRouterTargets(
    const RouterTargets& targets, const HostResolver& resolve) {
  if (!targets.is_dns()) return targets.addresses;
  absl::StatusOr<std::vector<std::string>> hosts = resolve(targets.dns_name);
  if (!hosts.ok()) return hosts.status();
  std::vector<std::string> addresses;
  for (const std::string& host : *hosts) {
    addresses.push_back(absl::StrContains(host, ':')
                            ? absl::StrCat("[", host, "]:", targets.dns_port)
                            : absl::StrCat(host, ":", targets.dns_port));
  }
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()),
                  addresses.end());
  return addresses;
}

}  // namespace pdserve::worker
