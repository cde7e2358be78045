// The memory-bandwidth floor: how fast this machine reads a buffer much larger than its caches, measured
// in the same run as the benchmarks so that every time can be printed as a multiple of it.
#pragma once

#include <cstddef>

namespace kvq::bench {

// Bytes per second read by `threads` threads, each streaming its part of a `bytes` buffer; best of
// `repeats` passes (the floor is the fastest the hardware allows; noise only makes a pass slower).
// The first call per thread count measures; later calls return the cached figure.
double read_bandwidth(int threads = 1, size_t bytes = size_t(512) << 20, int repeats = 5);

}  // namespace kvq::bench
