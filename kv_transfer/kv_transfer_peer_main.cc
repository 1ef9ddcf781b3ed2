// pd-kv-peer: one side of a KV transfer between two processes, for the
// multi-process tests (tests/kv_transfer_process_test.cc) and by hand.
//
//   pd-kv-peer receive --dir=D [--tokens=N --blocks=B --timeout_ms=T
//                              --pool=allocated|registered]
//     makes a KV pool (SmolLM2-135M shape) that the transport allocated (as a
//     decode worker's: shared memory that the sender stores into directly)
//     or that it registered (heap memory, written through the endpoint),
//     writes the transfer target to D/target.pb, waits for the completion
//     notice, verifies every layer's checksum, and dumps its pool to
//     D/pool.bin.
//   pd-kv-peer send --dir=D [--layer_delay_ms=X --corrupt --timeout_ms=T]
//     reads D/target.pb, fills its own pool with random bytes (dumped to
//     D/source.bin), writes the target's positions layer by layer over UCX
//     and sends the notice.
//
// Exit codes: 0 success, 3 checksum mismatch (DATA_LOSS), 4 deadline passed,
// 5 peer unavailable, 1 any other error, 2 bad usage. D/result.txt holds the
// final status.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "kv_transfer/fault_injecting_transport.h"
#include "kv_transfer/kv_block_transfer.h"
#include "kv_transfer/ucx_transport.h"

ABSL_FLAG(std::string, dir, "", "folder shared by the two sides");
ABSL_FLAG(int32_t, tokens, 1000, "receive: tokens of the request");
ABSL_FLAG(int32_t, blocks, 96, "blocks per layer in each pool");
ABSL_FLAG(int32_t, timeout_ms, 10000, "deadline of the whole transfer");
ABSL_FLAG(int32_t, layer_delay_ms, 0,
          "send: pause after each layer (stands for its compute)");
ABSL_FLAG(bool, corrupt, false, "send: corrupt one byte of every write");
ABSL_FLAG(std::string, pool, "allocated",
          "receive: the pool's memory: allocated by the transport (as decode "
          "workers do) or registered heap memory");

namespace pdserve::kv_transfer {

using ::pdserve::kv_layout::KvGeometry;

namespace {

v1::KvLayout SmolLm2Layout(uint32_t blocks) {
  v1::KvLayout layout;
  layout.set_layout_version(1);
  layout.set_model_fingerprint("smollm2-135m");
  layout.set_num_layers(30);
  layout.set_num_kv_heads(3);
  layout.set_head_dim(64);
  layout.set_dtype(v1::KV_DTYPE_F16);
  layout.set_block_size_tokens(16);
  layout.set_num_blocks(blocks);
  return layout;
}

int Finish(const std::string& dir, const absl::Status& status) {
  std::ofstream(dir + "/result.txt") << status.ToString() << "\n";
  if (!status.ok()) PD_LOG(ERROR) << status;
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kDataLoss:
      return 3;
    case absl::StatusCode::kDeadlineExceeded:
      return 4;
    case absl::StatusCode::kUnavailable:
      return 5;
    default:
      return 1;
  }
}

void Dump(const std::string& path, const uint8_t* bytes, size_t size) {
  std::ofstream out(path + ".tmp", std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes), size);
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

std::vector<uint8_t> RandomPool(uint64_t bytes, uint32_t seed) {
  std::vector<uint8_t> pool(bytes);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= pool.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(pool.data() + i, &v, 8);
  }
  return pool;
}

int Receive(const std::string& dir) {
  const v1::KvLayout layout = SmolLm2Layout(absl::GetFlag(FLAGS_blocks));
  const KvGeometry geometry = *KvGeometry::FromProto(layout);
  // What the pool holds before the transfer (the test knows it too).
  const std::vector<uint8_t> initial = RandomPool(geometry.pool_bytes(), 2);
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create({.name = "receiver"});
  if (!transport.ok()) return Finish(dir, transport.status());
  std::vector<uint8_t> heap;
  uint8_t* pool = nullptr;
  absl::StatusOr<RegionId> region;
  if (absl::GetFlag(FLAGS_pool) == "allocated") {
    absl::StatusOr<AllocatedRegion> allocated =
        (*transport)->AllocateRegion(initial.size());
    if (!allocated.ok()) return Finish(dir, allocated.status());
    region = allocated->id;
    pool = allocated->base;
    std::memcpy(pool, initial.data(), initial.size());
  } else {
    heap = initial;
    pool = heap.data();
    region = (*transport)
                 ->RegisterRegion(pool, heap.size(), v1::MEMORY_KIND_HOST, 0);
  }
  if (!region.ok()) return Finish(dir, region.status());

  v1::KvTransferTarget target;
  target.set_transfer_id(absl::StrCat("receiver-", ::getpid(), "/1"));
  target.set_request_id("req-1");
  *target.mutable_layout() = layout;
  *target.mutable_region() = *(*transport)->ExportRegion(*region);
  const uint32_t tokens = absl::GetFlag(FLAGS_tokens);
  const uint32_t needed = (tokens + 15) / 16;
  if (needed > layout.num_blocks()) {
    return Finish(dir, absl::InvalidArgumentError("not enough blocks"));
  }
  // Scattered, descending block ids: real pools are rarely contiguous.
  for (uint32_t i = 0; i < needed; ++i) {
    target.add_block_ids(layout.num_blocks() - 1 - i);
  }
  target.set_num_tokens(tokens);
  {
    std::ofstream out(dir + "/target.pb.tmp", std::ios::binary);
    target.SerializeToOstream(&out);
  }
  std::rename((dir + "/target.pb.tmp").c_str(), (dir + "/target.pb").c_str());
  PD_LOG(INFO) << "target written; waiting for " << target.transfer_id();

  absl::StatusOr<std::string> payload =
      (*transport)
          ->AwaitNotice(target.transfer_id(),
                        absl::Now() + absl::Milliseconds(
                                          absl::GetFlag(FLAGS_timeout_ms)));
  if (!payload.ok()) return Finish(dir, payload.status());
  v1::KvTransferComplete notice;
  if (!notice.ParseFromString(*payload)) {
    return Finish(dir, absl::DataLossError("unparsable notice"));
  }
  const absl::Status verified =
      VerifyKvTransfer(notice, target, pool, geometry);
  Dump(dir + "/pool.bin", pool, initial.size());
  PD_LOG(INFO) << "received " << notice.bytes_written() << " bytes in "
               << notice.transfer_ms() << " ms: " << verified;
  return Finish(dir, verified);
}

int Send(const std::string& dir) {
  v1::KvTransferTarget target;
  {
    std::ifstream in(dir + "/target.pb", std::ios::binary);
    if (!in || !target.ParseFromIstream(&in)) {
      return Finish(dir, absl::NotFoundError("no readable target.pb"));
    }
  }
  const v1::KvLayout layout = SmolLm2Layout(absl::GetFlag(FLAGS_blocks));
  const KvGeometry geometry = *KvGeometry::FromProto(layout);
  std::vector<uint8_t> pool = RandomPool(geometry.pool_bytes(), 1);
  Dump(dir + "/source.bin", pool.data(), pool.size());
  absl::StatusOr<std::unique_ptr<UcxTransport>> ucx =
      UcxTransport::Create({.name = "sender"});
  if (!ucx.ok()) return Finish(dir, ucx.status());
  FaultInjectingTransport transport(std::move(ucx).value());
  if (absl::GetFlag(FLAGS_corrupt)) {
    TransportFaults faults;
    faults.corrupt_writes = true;
    transport.set_faults(faults);
  }
  absl::StatusOr<RegionId> region = transport.RegisterRegion(
      pool.data(), pool.size(), v1::MEMORY_KIND_HOST, 0);
  if (!region.ok()) return Finish(dir, region.status());
  absl::StatusOr<PeerRegionId> remote =
      transport.ImportPeerRegion(target.region());
  if (!remote.ok()) return Finish(dir, remote.status());

  KvTransferWriterOptions options;
  options.transport = &transport;
  options.local_region = *region;
  options.local_pool = pool.data();
  options.local_layout = layout;
  for (int i = 0; i < target.block_ids_size(); ++i) {
    options.local_block_ids.push_back(i);  // Contiguous on this side.
  }
  options.target = target;
  options.remote_region = *remote;
  options.prefill_worker_id = "sender";
  options.deadline =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  absl::StatusOr<std::unique_ptr<KvTransferWriter>> writer =
      KvTransferWriter::Create(std::move(options));
  if (!writer.ok()) return Finish(dir, writer.status());
  const absl::Duration layer_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_layer_delay_ms));
  for (uint32_t layer = 0; layer < layout.num_layers(); ++layer) {
    if (absl::Status s = (*writer)->WriteLayer(layer); !s.ok()) {
      return Finish(dir, s);
    }
    absl::SleepFor(layer_delay);
  }
  absl::StatusOr<v1::KvTransferComplete> notice = (*writer)->Finish();
  if (!notice.ok()) return Finish(dir, notice.status());
  PD_LOG(INFO) << "sent " << notice->bytes_written() << " bytes in "
               << notice->transfer_ms() << " ms";
  return Finish(dir, absl::OkStatus());
}

}  // namespace
}  // namespace pdserve::kv_transfer

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (args.size() != 2 || dir.empty()) {
    std::cerr << "usage: pd-kv-peer receive|send --dir=D\n";
    return 2;
  }
  const std::string role = args[1];
  pdserve::SetLogTag(role);
  if (role == "receive") return pdserve::kv_transfer::Receive(dir);
  if (role == "send") return pdserve::kv_transfer::Send(dir);
  std::cerr << "unknown role " << role << "\n";
  return 2;
}
