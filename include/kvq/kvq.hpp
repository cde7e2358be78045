// kvq — the engine's C++ API in one header: codecs (kvq/codec.hpp), the exceptions (kvq/errors.hpp),
// the block-wise cache (kvq/cache.hpp), attention on rows an engine owns (kvq/attention.hpp), the SIMD
// level and its self-check (kvq/simd.hpp, kvq/selftest.hpp). Link kvq::kvq (libkvq.so) or
// kvq::kvq_static. These headers and kvq/kvq.h are all of include/kvq/ (scripts/check_layers.py checks it).
// The research tools (FP32 reference, data sets, sweeps, planner: kvq/research/eval.hpp and its
// neighbours in kvq/research/) are in kvq::research and not included here.
#pragma once

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/errors.hpp"
#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"
