#include "rpc/cluster_credential.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve::rpc {
namespace {

// gRPC metadata values (non-binary keys) are printable ASCII.
bool IsMetadataSafe(absl::string_view token) {
  for (char c : token) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Compares every byte of `expected` whatever the input, so the time taken
// depends only on the expected token's length.
bool ConstantTimeEquals(absl::string_view presented,
                        absl::string_view expected) {
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p =
        i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff = diff | (p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<ClusterCredential> ClusterCredential::FromFile(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cluster token file ", path, " cannot be read"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("cluster token file ", path, ": read error"));
  }
  return FromText(contents.str(), path);
}

absl::StatusOr<ClusterCredential> ClusterCredential::FromText(
    absl::string_view text, absl::string_view source) {
  ClusterCredential credential;
  credential.source_ = std::string(source);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    if (token.empty()) continue;
    if (!IsMetadataSafe(token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster token file ", source, " line ", line_number,
                       ": a token must be printable ASCII"));
    }
    credential.tokens_.emplace_back(token);
  }
  if (credential.tokens_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster token file ", source, " holds no token (one per line)"));
  }
  return credential;
}

const std::string& ClusterCredential::presented_token() const {
  static const std::string* const kNone = new std::string();
  return tokens_.empty() ? *kNone : tokens_.front();
}

bool ClusterCredential::Accepts(absl::string_view token) const {
  // Every accepted token is compared, so the time does not tell which one
  // matched either.
  bool accepted = false;
  for (const std::string& expected : tokens_) {
    accepted = ConstantTimeEquals(token, expected) || accepted;
  }
  return accepted;
}

}  // namespace pdserve::rpc
