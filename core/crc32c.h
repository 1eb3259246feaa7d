#ifndef CORE_CRC32C_H_
#define CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace mcc {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
// ext4 and TFRecord. Uses the SSE4.2 crc32 instruction when the CPU has it
// (checked once at run time) and a slice-by-8 table otherwise.

// The CRC of data[0, n).
uint32_t Crc32c(const void* data, size_t n);
// The CRC of A followed by data[0, n), given crc = Crc32c(A).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

namespace crc32c_internal {
// The two implementations, exposed for tests and the benchmark.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);
bool HasHardwareSupport();
}  // namespace crc32c_internal

}  // namespace mcc

#endif  // CORE_CRC32C_H_
