# Project-wide helpers: warnings, sanitizers, one library per module folder, one
# ctest entry per test file.

# ASan+UBSan: every check aborts, except `null`, which only recovers so that
# cmake/ubsan.supp can silence one known case in CAF's headers; ctest runs
# the suites with UBSAN_OPTIONS=halt_on_error=1, so any other finding fails.
function(dualpath_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>)
  if(DUALPATH_SANITIZE STREQUAL "address")
    # -Wno-maybe-uninitialized: optimised (CI builds ASan at -O1), GCC 12's
    # flow analysis under -fsanitize=address,undefined reports libstdc++'s
    # own std::regex internals (a std::function in _StateT) as maybe
    # uninitialized. The plain build (-O2) keeps the warning as an error,
    # so a real case still fails CI's first step.
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -fsanitize-recover=null>
      $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-maybe-uninitialized>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(DUALPATH_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread>)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  elseif(DUALPATH_SANITIZE STREQUAL "fuzz")
    # Coverage for libFuzzer (fuzz/ links the fuzzer's main) plus ASan+UBSan.
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(NOT DUALPATH_SANITIZE STREQUAL "")
    message(FATAL_ERROR "DUALPATH_SANITIZE must be '', 'address', 'thread' or 'fuzz', not '${DUALPATH_SANITIZE}'")
  endif()
endfunction()

# dualpath_module(NAME DEPS ...): library dualpath_<NAME> from the .cpp files of the
# calling folder (not its subfolders: a subfolder is a module of its own, e.g.
# transport/bulk -> dualpath_transport_bulk). Headers are included as
# "<folder>/<file>.hpp" from the repository root.
function(dualpath_module name)
  cmake_parse_arguments(M "" "" "DEPS;EXCLUDE" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*.cpp")
  foreach(ex IN LISTS M_EXCLUDE)
    list(FILTER srcs EXCLUDE REGEX "${ex}")
  endforeach()
  if(srcs)
    add_library(dualpath_${name} STATIC ${srcs})
    # Position-independent, so that the Python extension (a shared object,
    # actors/client/python/) can link the modules it needs.
    set_target_properties(dualpath_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_include_directories(dualpath_${name} PUBLIC "${PROJECT_SOURCE_DIR}")
    target_link_libraries(dualpath_${name} PUBLIC ${M_DEPS})
    dualpath_target_defaults(dualpath_${name})
  else()
    add_library(dualpath_${name} INTERFACE)
    target_include_directories(dualpath_${name} INTERFACE "${PROJECT_SOURCE_DIR}")
    target_link_libraries(dualpath_${name} INTERFACE ${M_DEPS})
  endif()
endfunction()

# dualpath_suite(FILE LIBS ...): one executable and one ctest entry per test file.
# Each test file names its area on a line `// ctest-label: <area>`; areas are
# foundation storage transport engines scheduler run distribution observability sim
# integration.
# A suite exits 77 to report "skipped" (hardware absent), after printing why.
set(DUALPATH_TEST_AREAS foundation storage transport engines scheduler run distribution observability sim integration)
# dualpath_suite_names(FILE COMMENT): sets rel, stem, test_name and label in
# the caller for a suite file whose comments start with COMMENT ("//", "#").
macro(dualpath_suite_names file comment)
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}/tests" "${file}")
  string(REGEX REPLACE "\\.[a-z]+$" "" stem "${rel}")
  string(REPLACE "/" "." test_name "${stem}")
  file(STRINGS "${file}" label_line REGEX "^${comment} ctest-label: [a-z]+")
  if(NOT label_line)
    message(FATAL_ERROR "${rel}: missing a '${comment} ctest-label: <area>' line")
  endif()
  string(REGEX REPLACE "^${comment} ctest-label: ([a-z]+).*" "\\1" label "${label_line}")
  if(NOT label IN_LIST DUALPATH_TEST_AREAS)
    message(FATAL_ERROR "${rel}: label '${label}' is not one of ${DUALPATH_TEST_AREAS}")
  endif()
endmacro()

function(dualpath_suite file)
  cmake_parse_arguments(S "" "" "LIBS" ${ARGN})
  dualpath_suite_names("${file}" "//")
  string(REPLACE "/" "_" exe "test_${stem}")
  # tests/<a>/<b>/x.cpp tests the module dualpath_<a>_<b>; tests/cmd/ tests the command.
  get_filename_component(dir "${rel}" DIRECTORY)
  string(REPLACE "/" "_" module "dualpath_${dir}")
  if(NOT TARGET ${module})
    message(FATAL_ERROR "${rel}: tests/${dir} mirrors no module (no target ${module})")
  endif()
  # A suite that exercises its module together with others (an engine with a
  # storage reader, say) names them on a line `// ctest-links: <module> ...`
  # (module names without the dualpath_ prefix, e.g. actors_storage, or
  # imported libraries such as CAF::io).
  file(STRINGS "${file}" links_line REGEX "^// ctest-links: ")
  set(extra "")
  if(links_line)
    string(REGEX REPLACE "^// ctest-links: " "" links "${links_line}")
    separate_arguments(links)
    foreach(l IN LISTS links)
      if(l MATCHES "::" AND TARGET ${l})
        list(APPEND extra ${l}) # an imported library, e.g. CAF::io
      elseif(TARGET dualpath_${l})
        list(APPEND extra dualpath_${l})
      else()
        message(FATAL_ERROR "${rel}: ctest-links names '${l}', which is no module or library")
      endif()
    endforeach()
  endif()
  add_executable(${exe} "${file}")
  target_link_libraries(${exe} PRIVATE dualpath_test_support ${module} ${extra} ${S_LIBS})
  dualpath_target_defaults(${exe})
  if(DUALPATH_SUITE_FLAGS)
    separate_arguments(suite_flags UNIX_COMMAND "${DUALPATH_SUITE_FLAGS}")
    target_compile_options(${exe} PRIVATE ${suite_flags})
  endif()
  set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  add_test(NAME ${test_name} COMMAND ${exe})
  # A suite that runs a deployment of real-time processes names that on a
  # line `// ctest-serial: <why>`: ctest runs it alone (RUN_SERIAL), so a
  # parallel suite cannot starve its emulation, with a longer limit for the
  # sanitizer builds.
  file(STRINGS "${file}" serial_line REGEX "^// ctest-serial: .+")
  set(timeout 300)
  if(serial_line)
    set_tests_properties(${test_name} PROPERTIES RUN_SERIAL TRUE)
    set(timeout 900)
  endif()
  set_tests_properties(${test_name} PROPERTIES LABELS "${label}" SKIP_RETURN_CODE 77
    TIMEOUT ${timeout} ENVIRONMENT "DUALPATH_BUILD_DIR=${CMAKE_BINARY_DIR};DUALPATH_SOURCE_DIR=${PROJECT_SOURCE_DIR};UBSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/cmake/ubsan.supp:halt_on_error=1:print_stacktrace=1;TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/cmake/tsan.supp:halt_on_error=1:second_deadlock_stack=1")
endfunction()

# dualpath_python_suite(FILE): one ctest entry per Python test file (a line
# `# ctest-label: <area>`), run by the interpreter the Python module was
# built for (DUALPATH_PYTHON) with the module on PYTHONPATH. Not registered
# when the module is not built (no pybind11). Exit 77 reports "skipped".
function(dualpath_python_suite file)
  if(NOT TARGET dualpath_python)
    return()
  endif()
  dualpath_suite_names("${file}" "#")
  add_test(NAME ${test_name} COMMAND "${DUALPATH_PYTHON}" "${file}")
  set_tests_properties(${test_name} PROPERTIES LABELS "${label}" SKIP_RETURN_CODE 77
    TIMEOUT 300 ENVIRONMENT "PYTHONPATH=${DUALPATH_PYTHONPATH};DUALPATH_BUILD_DIR=${CMAKE_BINARY_DIR};DUALPATH_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
