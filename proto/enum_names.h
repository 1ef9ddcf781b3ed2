// Short, human-facing names of the enums in proto/common.proto, for logs,
// worker ids and pdctl tables (the generated *_Name functions give the full
// WORKER_ROLE_PREFILL-style identifiers).
//
// Stateless functions; thread-safe.
#ifndef PDSERVE_PROTO_ENUM_NAMES_H_
#define PDSERVE_PROTO_ENUM_NAMES_H_

#include "proto/common.pb.h"

namespace pdserve {

// "prefill", "decode", "colocated", or "worker" for an unset role.
const char* ShortRoleName(v1::WorkerRole role);

// "STARTING", "SERVING", "DRAINING", "DEAD", or "?" for an unset state.
const char* ShortStateName(v1::WorkerState state);

}  // namespace pdserve

#endif  // PDSERVE_PROTO_ENUM_NAMES_H_
