// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and Snappy use it: the checksum of
// every section and block of a cache file. On x86-64 CPUs with SSE4.2 (all since 2008) the crc32 instruction
// (chosen once at run time; one chain of 8-byte steps: 4.95 GB/s against the tables' 1.03 on a Zen 4, 256 MiB,
// best of 5; a page-cache read ran at 5.9 GB/s there, so loading is no longer checksum-bound 6:1); elsewhere
// (arm64 included: its CRC32 extension is optional before v8.1, and no arm64 machine tests it here) tables,
// slicing by 8. Both give the same bits (tests/test_cache_file.cpp). Not a
// library's: a dependency of the engine for 30 lines (Debian's libcrc32c is not in every distribution).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

// CRC32C of n bytes. To checksum data in pieces, pass the previous result as `crc`:
// crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The tables' version, and whether crc32c uses the CPU's instruction instead (for tests and benchmarks).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
bool crc32c_hardware();

}  // namespace kvq::detail
