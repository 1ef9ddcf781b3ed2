#include "rpc/cluster_credential.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rpc/cluster_credential_flags.h"

namespace pdserve::rpc {
namespace {

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(ClusterCredentialTest, DefaultIsAuthOff) {
  const ClusterCredential off;
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.presented_token(), "");
  EXPECT_EQ(off.accepted_count(), 0u);
  EXPECT_FALSE(off.Accepts(""));
}

TEST(ClusterCredentialTest, OneTokenTrimmed) {
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromText("  s3cret-token \r\n", "test");
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_TRUE(credential->enabled());
  EXPECT_EQ(credential->presented_token(), "s3cret-token");
  EXPECT_TRUE(credential->Accepts("s3cret-token"));
  EXPECT_FALSE(credential->Accepts("s3cret-toke"));
  EXPECT_FALSE(credential->Accepts("s3cret-token2"));
  EXPECT_FALSE(credential->Accepts(" s3cret-token"));
  EXPECT_FALSE(credential->Accepts(""));
}

TEST(ClusterCredentialTest, RotationPresentsFirstAcceptsAll) {
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromText("\nnew-token\n\n  old-token\n", "test");
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->presented_token(), "new-token");
  EXPECT_EQ(credential->accepted_count(), 2u);
  EXPECT_TRUE(credential->Accepts("new-token"));
  EXPECT_TRUE(credential->Accepts("old-token"));
  EXPECT_FALSE(credential->Accepts("new-tokenold-token"));
}

TEST(ClusterCredentialTest, EmptyFileIsAnError) {
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromText(" \n\t\n", "/secrets/token");
  ASSERT_FALSE(credential.ok());
  EXPECT_EQ(credential.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(credential.status().message().find("/secrets/token"),
            std::string::npos);
}

TEST(ClusterCredentialTest, NonPrintableTokenIsAnErrorThatDoesNotEchoIt) {
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromText("good\nhidden\x01secret\n", "f");
  ASSERT_FALSE(credential.ok());
  EXPECT_NE(credential.status().message().find("line 2"), std::string::npos);
  EXPECT_EQ(credential.status().message().find("secret"), std::string::npos);
}

TEST(ClusterCredentialTest, MissingFileIsAnError) {
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromFile("/nonexistent/pdserve/token");
  ASSERT_FALSE(credential.ok());
  EXPECT_EQ(credential.status().code(), absl::StatusCode::kNotFound);
}

TEST(ClusterCredentialTest, FromFile) {
  const std::string path = WriteFile("token", "file-token\n");
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::FromFile(path);
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->presented_token(), "file-token");
  EXPECT_EQ(credential->source(), path);
}

TEST(ClusterCredentialFlagsTest, FlagThenEnvironmentThenOff) {
  const std::string flag_file = WriteFile("flag_token", "from-flag\n");
  const std::string env_file = WriteFile("env_token", "from-env\n");
  ::unsetenv(kClusterTokenFileEnv);
  absl::SetFlag(&FLAGS_cluster_token_file, "");
  absl::StatusOr<ClusterCredential> off = ClusterCredentialFromFlags();
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());

  ::setenv(kClusterTokenFileEnv, env_file.c_str(), 1);
  absl::StatusOr<ClusterCredential> env = ClusterCredentialFromFlags();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->presented_token(), "from-env");

  absl::SetFlag(&FLAGS_cluster_token_file, flag_file);
  absl::StatusOr<ClusterCredential> flag = ClusterCredentialFromFlags();
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->presented_token(), "from-flag");

  absl::SetFlag(&FLAGS_cluster_token_file, flag_file + ".missing");
  EXPECT_FALSE(ClusterCredentialFromFlags().ok());
  ::unsetenv(kClusterTokenFileEnv);
}

}  // namespace
}  // namespace pdserve::rpc
