// What the loader checks before it reads a payload: the header and the file's size, the configuration
// against the cache's, the payload sizes, and the block tables against each other and the cache's rules
// (lib/cache/cache_impl.hpp). Each throws BadCacheFile (ConfigMismatch for the configuration) and changes
// nothing; cache_load.cpp then reads the payloads.
#pragma once

#include <cstdint>
#include <vector>

#include "cache_file.hpp"
#include "cache_impl.hpp"

namespace kvq::detail::file {

// Reads and checks the header, and that the file is exactly as long as the header says.
Header read_header(const InFile& f);
// Throws ConfigMismatch naming the first field in which the file's configuration differs from the cache's.
void check_matches(const detail::CacheImpl& c, const Header& h);
// The payload sizes this kvq would write for the configuration (a codec whose layout changed between
// versions shows up here).
void check_sizes(const detail::CacheImpl& c, const Header& h);
// The ring slots each staging payload holds: the whole ring, or (version 6) its first slots, as many as the
// payload size says (check_sizes has checked that it is one a saver writes).
uint64_t staging_payload_slots(const detail::CacheImpl& c, const Header& h);
// Every record valid, every block referenced, every staging payload used once. Returns the references
// per block (its reference count after loading).
std::vector<uint32_t> check_tables(const detail::CacheImpl& c, const Header& h, const Tables& t);

}  // namespace kvq::detail::file
