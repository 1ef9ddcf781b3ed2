// ClusterCredential: the shared token that admits a caller to pdserve's
// control plane (membership, admin, the worker APIs), read from a file that
// Kubernetes mounts from a Secret (docs/security.md).
//
// The file holds one token per non-empty line (surrounding whitespace is
// trimmed). The FIRST line is the token this process presents when it calls
// a peer; EVERY line is accepted from callers. That is how the credential
// is rotated without downtime: add the new token as a second line and roll
// every process, swap the two lines and roll, remove the old line and roll.
//
// A default-constructed credential is "auth off": nothing is presented and
// every caller is accepted (local development; the flag reader warns).
//
// Failure contract: FromFile fails (never yields "auth off") on a missing,
// unreadable or empty file, and on a token that cannot travel as gRPC
// metadata (bytes outside printable ASCII). The token never appears in an
// error message or a log line; only the file's path does.
//
// Thread-safety: immutable after construction; copy freely.
#ifndef PDSERVE_RPC_CLUSTER_CREDENTIAL_H_
#define PDSERVE_RPC_CLUSTER_CREDENTIAL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::rpc {

class ClusterCredential {
 public:
  // Auth off.
  ClusterCredential() = default;

  // Reads the token file at `path`; `path` names the source in errors.
  static absl::StatusOr<ClusterCredential> FromFile(const std::string& path);
  // Parses a token file's contents (FromFile without the file).
  static absl::StatusOr<ClusterCredential> FromText(absl::string_view text,
                                                    absl::string_view source);

  // Whether callers must present a token.
  bool enabled() const { return !tokens_.empty(); }
  // The token this process presents (the file's first line); empty when
  // auth is off.
  const std::string& presented_token() const;
  // How many tokens callers may present (1, or 2 during a rotation).
  size_t accepted_count() const { return tokens_.size(); }
  // Whether `token` is one of the accepted tokens. The comparison takes the
  // same time wherever the first differing byte is, so a caller cannot
  // learn a token byte by byte from response times.
  bool Accepts(absl::string_view token) const;
  // Where the tokens came from (the file's path), for logs.
  const std::string& source() const { return source_; }

 private:
  std::vector<std::string> tokens_;
  std::string source_;
};

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_CLUSTER_CREDENTIAL_H_
