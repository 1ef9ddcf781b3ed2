// The NCCL transport's wire format: what the writer sends and the receiver
// checks before it receives anything into its region. Private to the NCCL
// transport (nccl_transport.h describes the protocol); kept apart so that the
// writer and the receiver, which live in different files, agree on it by
// construction.
//
// Plain constants and structs; no CUDA or NCCL.
#ifndef PDSERVE_KV_TRANSFER_NCCL_WIRE_H_
#define PDSERVE_KV_TRANSFER_NCCL_WIRE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kv_transfer/nccl_transport.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer::nccl_internal {

// Ranks in every communicator: the region's owner receives, the writer
// sends.
constexpr int kReceiverRank = 0;
constexpr int kWriterRank = 1;

constexpr uint32_t kMagic = 0x564b4450;  // "PDKV" in memory (little-endian).
constexpr uint16_t kWireVersion = 1;

enum class MessageKind : uint16_t {
  kWrite = 1,
  kNotice = 2,
  kClose = 3,
  kHello = 4,  // Sets up the connection; no body.
};

// The fixed first message of every wire message. Host byte order: both ends
// are GPUs' hosts of one architecture.
struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;           // MessageKind.
  uint64_t sequence;       // 0, 1, 2, ... per communicator.
  uint64_t operation;      // The writer's operation id (for logs).
  uint64_t body_bytes;     // Size of the second message (0 for CLOSE).
  uint32_t extent_count;   // WRITE: WireExtents in the body.
  uint32_t key_bytes;      // NOTICE: key bytes at the start of the body.
  uint32_t payload_bytes;  // NOTICE: payload bytes after the key.
  uint32_t reserved[5];    // Zero.
};
static_assert(sizeof(WireHeader) == 64, "the header is 64 bytes on the wire");

struct WireExtent {
  uint64_t remote_offset;
  uint64_t length;
};
static_assert(sizeof(WireExtent) == 16);

constexpr size_t kHeaderBytes = sizeof(WireHeader);
constexpr size_t kMaxBodyBytes =
    std::max<size_t>(NcclTransport::kMaxExtentsPerMessage * sizeof(WireExtent),
                     NcclTransport::kMaxNoticeKeyBytes + kMaxNoticeBytes);
// One staging slot: header then body, rounded up to 4 KiB.
constexpr size_t kSlotBytes =
    (kHeaderBytes + kMaxBodyBytes + 4095) / 4096 * 4096;

// Extents are sent in pieces of at most this many bytes (both sides split
// the same way), keeping each NCCL message well inside its count limits.
constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 30;

}  // namespace pdserve::kv_transfer::nccl_internal

#endif  // PDSERVE_KV_TRANSFER_NCCL_WIRE_H_
