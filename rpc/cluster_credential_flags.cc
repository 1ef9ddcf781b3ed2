#include "rpc/cluster_credential_flags.h"

#include <cstdlib>

#include "absl/base/call_once.h"
#include "absl/flags/flag.h"
#include "common/log.h"

ABSL_FLAG(std::string, cluster_token_file, "",
          "file holding the cluster's control-plane token, one per line: the "
          "first is presented to peers, every line is accepted from callers "
          "(docs/security.md); empty: $PDSERVE_CLUSTER_TOKEN_FILE, and "
          "without it the control plane is open (local development only)");

namespace pdserve::rpc {

std::string ClusterTokenFileFromFlags() {
  std::string path = absl::GetFlag(FLAGS_cluster_token_file);
  if (!path.empty()) return path;
  const char* env = std::getenv(kClusterTokenFileEnv);
  return env == nullptr ? std::string() : std::string(env);
}

absl::StatusOr<ClusterCredential> ClusterCredentialFromFlags() {
  const std::string path = ClusterTokenFileFromFlags();
  if (path.empty()) {
    static absl::once_flag warned;
    absl::call_once(warned, [] {
      PD_LOG(WARNING) << "no --cluster_token_file: the control plane "
                         "(membership, admin, worker APIs) accepts any "
                         "caller; use this for local development only";
    });
    return ClusterCredential();
  }
  return ClusterCredential::FromFile(path);
}

}  // namespace pdserve::rpc
