// Request ids: what a client may pass in an x-request-id header (HTTP) or
// metadata entry (gRPC), and the ids the router makes when it passes none.
// The id travels in every worker call (the request_id fields of
// proto/worker.proto) and appears on every log line about the request in
// every process, so one request's timeline can be read across the router
// and its workers (grep the id in their logs).
//
// Thread-safety: thread-safe.
#ifndef PDSERVE_ROUTER_REQUEST_IDS_H_
#define PDSERVE_ROUTER_REQUEST_IDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pdserve::router {

// The HTTP header and gRPC metadata key (lower case, as gRPC requires).
inline constexpr char kRequestIdHeader[] = "x-request-id";
// Longest id a client may choose.
inline constexpr size_t kMaxRequestIdBytes = 128;

// 128 random bits, as 32 hex digits.
std::string NewRequestId();

// OK for an id of 1..kMaxRequestIdBytes printable ASCII characters
// (nothing a header or a log line would mangle); INVALID_ARGUMENT saying
// why otherwise.
absl::Status CheckRequestId(absl::string_view id);

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_REQUEST_IDS_H_
