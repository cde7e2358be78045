// The one test file that names this checkout's paths (tests/CMakeLists.txt says why).
#include "test_util.hpp"

const char* kvq::test::data_dir() { return KVQ_TEST_DATA_DIR; }
