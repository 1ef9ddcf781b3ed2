// A client of the router's Generation service: streams one request's chunks
// (pdctl generate, the quick start, tests and benchmarks).
//
// Thread-safety: stateless; each call uses its own channel.
#ifndef PDSERVE_CLI_GENERATE_CLIENT_H_
#define PDSERVE_CLI_GENERATE_CLIENT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/client.pb.h"

namespace pdserve::cli {

// Streams `request` from the router at `address`, calling `on_chunk` for
// each chunk as it arrives; returns the call's final status.
absl::Status StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    absl::Duration timeout,
    const std::function<void(const v1::GenerateResponse&)>& on_chunk);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_GENERATE_CLIENT_H_
