// The real `pdctl profile` against a real cluster of the tiny model whose
// workers sleep a known time per token computed (--testing_token_delay_us):
// the profile it writes parses as the planner's, and its figures are the
// delays, from above and not far above. Then bad input: an error, a
// non-zero exit, and no process of the cluster left behind.
#include <dirent.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "planner/capacity_profile.h"
#include "tests/cluster_testing.h"
#include "tests/pdctl_testing.h"

namespace pdserve::testing {
namespace {

constexpr double kPrefillTokenDelayS = 0.001;
constexpr double kDecodeTokenDelayS = 0.003;

// Processes (other than this one) whose command line mentions `needle`.
std::vector<std::string> ProcessesMentioning(const std::string& needle) {
  std::vector<std::string> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    const std::string pid = entry->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::stringstream text;
    text << in.rdbuf();
    std::string cmdline = text.str();
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    if (cmdline.find(needle) != std::string::npos) {
      found.push_back(absl::StrCat(pid, ": ", cmdline));
    }
  }
  ::closedir(proc);
  return found;
}

class ProfileTest : public PdctlClusterTest {
 protected:
  // pdctl profile on the tiny model with the test's flags; its exit code.
  int Profile(std::vector<std::string> args, std::string* output) {
    std::vector<std::string> all = {
        "profile", absl::StrCat("--bin_dir=", BinDir()),
        absl::StrCat("--worker_args=", absl::StrJoin(SmallWorkerArgs(), ",")),
        "--startup_timeout_s=60", "--timeout_s=60"};
    all.insert(all.end(), args.begin(), args.end());
    return Pdctl(all, output, absl::Seconds(150));
  }
};

TEST_F(ProfileTest, MeasuresTheWorkersTestingDelays) {
  const std::string model = TinyModelPath();
  const std::string out = absl::StrCat(work_dir_, "/profile.json");
  std::string output;
  ASSERT_EQ(
      Profile(
          {absl::StrCat("--model=", model),
           absl::StrCat("--prefill_worker_args=", "--testing_token_delay_us=",
                        kPrefillTokenDelayS * 1e6),
           absl::StrCat("--decode_worker_args=", "--testing_token_delay_us=",
                        kDecodeTokenDelayS * 1e6),
           "--prompt_lengths=32,128", "--batch_sizes=1,4",
           "--context_lengths=16,128", "--decode_tokens=24",
           absl::StrCat("--out=", out)},
          &output),
      0)
      << output;
  EXPECT_TRUE(ProcessesMentioning(model).empty())
      << absl::StrJoin(ProcessesMentioning(model), "\n");
  // Each cell's figure as it goes, and the total.
  EXPECT_NE(output.find("decode batch   4, context   128: ITL"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("profile measured in"), std::string::npos) << output;

  absl::StatusOr<planner::CapacityProfile> profile =
      planner::CapacityProfile::Load(out);
  ASSERT_TRUE(profile.ok()) << profile.status() << "\n" << output;
  EXPECT_EQ(profile->source().rfind("pdctl profile ", 0), 0u)
      << profile->source();
  EXPECT_NE(profile->hardware().find("--testing_token_delay_us=3000"),
            std::string::npos)
      << profile->hardware();
  EXPECT_EQ(profile->cost_unit(), "workers");
  EXPECT_EQ(profile->max_batch(), 64);  // the worker's default --max_running
  EXPECT_GT(profile->kv_capacity_tokens(), 0);
  EXPECT_GT(profile->prefill_load_time_s(), 0);
  EXPECT_GT(profile->decode_load_time_s(), 0);

  // Prefill: the worker sleeps 1 ms per prompt token, so it computes at
  // most 1000 tokens/s (5 % for the noise of one burst against a median),
  // and the tiny model's own compute is small beside the sleep: at least
  // half of that even on a CPU half as fast. A lone prompt waits at least
  // its sleep.
  ASSERT_EQ(profile->prefill_points().size(), 2u);
  for (const planner::PrefillPoint& p : profile->prefill_points()) {
    SCOPED_TRACE(absl::StrCat("prompt ", p.prompt_tokens));
    EXPECT_LE(p.tokens_per_s, 1.05 / kPrefillTokenDelayS);
    EXPECT_GE(p.tokens_per_s, 0.5 / kPrefillTokenDelayS);
    EXPECT_GE(p.ttft_s, p.prompt_tokens * kPrefillTokenDelayS);
  }
  // Decode: a step of b streams sleeps b x 3 ms. The steady-state ITL is at
  // least that (5 % for the client's arrival jitter about the median) and
  // at most 1.5x that plus 10 ms (the tiny model's step, the router and
  // gRPC: about 1 ms today; the bound holds on a CPU half as fast). ITL
  // taken over the streams' start-up, when fewer of them run, falls below
  // the lower bound.
  for (int batch : {1, 4}) {
    for (int context : {16, 128}) {
      SCOPED_TRACE(absl::StrCat("batch ", batch, ", context ", context));
      const double step = batch * kDecodeTokenDelayS;
      const double itl = profile->DecodeStepSeconds(batch, context);
      EXPECT_GE(itl, 0.95 * step) << output;
      EXPECT_LE(itl, 1.5 * step + 0.010) << output;
    }
  }
}

TEST_F(ProfileTest, BadInputIsAnErrorAndLeavesNoProcessBehind) {
  const std::string model = TinyModelPath();
  std::string output;
  // A model file that does not exist.
  EXPECT_EQ(
      Profile({absl::StrCat("--model=", work_dir_, "/missing.gguf")}, &output),
      1);
  EXPECT_NE(output.find("no model file"), std::string::npos) << output;
  // An empty or malformed grid.
  EXPECT_EQ(
      Profile({absl::StrCat("--model=", model), "--batch_sizes="}, &output), 2);
  EXPECT_NE(output.find("--batch_sizes is empty"), std::string::npos) << output;
  EXPECT_EQ(
      Profile({absl::StrCat("--model=", model), "--prompt_lengths=x"}, &output),
      2);
  // A cluster that does not start: the decode worker refuses its flags
  // after the router is up.
  EXPECT_EQ(Profile({absl::StrCat("--model=", model),
                     "--decode_worker_args=--kv_cache_mb=-1"},
                    &output),
            1);
  EXPECT_NE(output.find("decode-0"), std::string::npos) << output;
  EXPECT_TRUE(ProcessesMentioning(model).empty())
      << absl::StrJoin(ProcessesMentioning(model), "\n");
  // A grid the decode worker cannot hold, found once the cluster runs:
  // the error names the cell and the cluster is stopped.
  EXPECT_EQ(Profile({absl::StrCat("--model=", model),
                     "--decode_worker_args=--kv_cache_mb=1",
                     "--prompt_lengths=32", "--batch_sizes=1,64",
                     "--context_lengths=300", "--decode_tokens=100"},
                    &output),
            1);
  EXPECT_NE(output.find("decode cell batch 64, context 300 needs"),
            std::string::npos)
      << output;
  EXPECT_TRUE(ProcessesMentioning(model).empty())
      << absl::StrJoin(ProcessesMentioning(model), "\n");
}

}  // namespace
}  // namespace pdserve::testing
