// `pdctl bench`: the load generator's command line (loadgen/).
//
//   pdctl bench [--target=grpc://H:P | http://H:P] [--workload=fixed|uniform|
//               shared_prefix|trace] [--request_rate=R1,R2,... | inf]
//               [--burstiness=B] [--max_concurrency=N] [--num_requests=N]
//               [--prompt_tokens=N --output_tokens=N --range_ratio=X]
//               [--num_prefixes=N --prefix_tokens=N] [--trace=FILE]
//               [--slo_ttft_ms=MS --slo_tpot_ms=MS] [--json=FILE]
//               [--plot=FILE.png]
//   pdctl bench --write_trace=FILE [--num_requests=N --request_rate=R]
//               writes a synthetic chat-shaped trace instead.
//
// One run per request rate (a sweep), each preceded by one warm-up request
// that must succeed. Prints progress to stderr and a summary table per rate,
// writes every request's record and the summaries as JSON, and plots them
// with bench/plot_serving.py (latency CDFs; goodput and p99 TTFT/TPOT
// against the rate).
#ifndef PDSERVE_CLI_BENCH_COMMAND_H_
#define PDSERVE_CLI_BENCH_COMMAND_H_

namespace pdserve::cli {

// Exit code: 0 success, 1 the benchmark could not run, 2 bad usage.
int Bench();

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_BENCH_COMMAND_H_
