#pragma once
// Which sanitizer a suite was built with, for the few suites that change what
// they check under one. GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__; clang answers __has_feature instead.

#if defined(__SANITIZE_ADDRESS__)
#  define DUALPATH_TEST_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define DUALPATH_TEST_ASAN 1
#  endif
#endif

#if defined(__SANITIZE_THREAD__)
#  define DUALPATH_TEST_TSAN 1
#elif defined(__has_feature)
#  if __has_feature(thread_sanitizer)
#    define DUALPATH_TEST_TSAN 1
#  endif
#endif
