# The shared library libkvq.so (target kvq_shared, installed as kvq::kvq): every object of the static
# library kvq, so nothing is compiled twice. The version script exports the C API (kvq_*) and the public
# C++ API (namespace kvq) and hides everything else (std:: and Eigen instantiations), and every symbol
# must resolve when the library is linked (except under sanitizers: clang leaves the sanitizer runtime
# out of shared libraries, for the executable to bring).
# kvq.map is its only listed source (CMake needs one); the objects come from the archive.
add_library(kvq_shared SHARED kvq.map)
target_link_libraries(kvq_shared PRIVATE $<LINK_LIBRARY:WHOLE_ARCHIVE,kvq> PUBLIC Threads::Threads)
target_include_directories(kvq_shared
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
set_target_properties(kvq_shared PROPERTIES
  OUTPUT_NAME kvq
  LINKER_LANGUAGE CXX
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR})
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" OR CMAKE_SYSTEM_NAME MATCHES "BSD")
  target_link_options(kvq_shared PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/kvq.map")
  if(NOT KVQ_SANITIZE)
    target_link_options(kvq_shared PRIVATE "LINKER:--no-undefined")
  endif()
  set_property(TARGET kvq_shared APPEND PROPERTY LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kvq.map)
endif()
add_library(kvq::kvq_shared ALIAS kvq_shared)
