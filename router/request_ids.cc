#include "router/request_ids.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve::router {

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

absl::Status CheckRequestId(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("the request id is empty");
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request id is longer than ", kMaxRequestIdBytes, " bytes"));
  }
  for (char c : id) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "the request id must be printable ASCII without spaces");
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::router
