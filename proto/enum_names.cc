#include "proto/enum_names.h"

namespace pdserve {

const char* ShortRoleName(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case v1::WORKER_ROLE_DECODE:
      return "decode";
    case v1::WORKER_ROLE_BOTH:
      return "colocated";
    default:
      return "worker";
  }
}

const char* ShortStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_STARTING:
      return "STARTING";
    case v1::WORKER_STATE_SERVING:
      return "SERVING";
    case v1::WORKER_STATE_DRAINING:
      return "DRAINING";
    case v1::WORKER_STATE_DEAD:
      return "DEAD";
    default:
      return "?";
  }
}

}  // namespace pdserve
