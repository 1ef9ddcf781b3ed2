// --cluster_token_file, the one flag every pdserve process (pd-router, both
// workers, pd-planner, pdctl) reads its control-plane credential from
// (rpc/cluster_credential.h); the environment variable
// PDSERVE_CLUSTER_TOKEN_FILE stands in when the flag is not given.
//
// Neither set: auth off, with one warning logged (local development only).
// Set to a missing, unreadable or empty file: an error the process must
// stop on, never a silent "auth off".
#ifndef PDSERVE_RPC_CLUSTER_CREDENTIAL_FLAGS_H_
#define PDSERVE_RPC_CLUSTER_CREDENTIAL_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "rpc/cluster_credential.h"

ABSL_DECLARE_FLAG(std::string, cluster_token_file);

namespace pdserve::rpc {

inline constexpr char kClusterTokenFileEnv[] = "PDSERVE_CLUSTER_TOKEN_FILE";

// --cluster_token_file, else $PDSERVE_CLUSTER_TOKEN_FILE, else "".
std::string ClusterTokenFileFromFlags();

// The credential from the file above (auth off when there is none).
absl::StatusOr<ClusterCredential> ClusterCredentialFromFlags();

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_CLUSTER_CREDENTIAL_FLAGS_H_
