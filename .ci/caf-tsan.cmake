# Included by .ci/caf-tsan into CAF's configure (CMAKE_PROJECT_INCLUDE):
# libcaf_core, 139 of CAF's 184 source files, compiles as unity batches
# (one compiler run parses CAF's headers for 16 files), which cuts the
# instrumented build's time by more than half on CI's two cores. Its sources
# share no file-local names; libcaf_io's do (port_of, receive_buffer_size in
# anonymous namespaces), so it and libcaf_openssl compile file by file.
if(NOT COMMAND dualpath_caf_unity)
  function(dualpath_caf_unity)
    set_target_properties(libcaf_core_shared PROPERTIES
      UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
  endfunction()
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL dualpath_caf_unity)
endif()
