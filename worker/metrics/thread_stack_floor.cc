// civetweb (Debian's 1.15, behind the metrics exporter) starts its threads
// with a fixed 100 KiB stack. glibc carves a thread's static TLS out of its
// stack, and the worker's libraries take much of that (OpenBLAS alone 60
// KiB), so pthread_create fails with EINVAL and --metrics-listen could not
// start. Defined in the executable, this interposes glibc's
// pthread_attr_setstacksize for every library and raises requests below
// kStackFloor to it; larger requests pass through unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {
constexpr size_t kStackFloor = size_t{512} << 10;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, std::max(size, kStackFloor));
}
