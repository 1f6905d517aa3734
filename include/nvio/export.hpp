// What libnvio.so exports. The library is compiled with hidden visibility (src/CMakeLists.txt), and
// every public header declares its API between NVIO_API_BEGIN and NVIO_API_END, so that exactly
// what include/nvio declares is exported: the library's internals (nvio::detail, its engines,
// CUDA loader, workers) and the third-party code it is built with stay out of its dynamic symbol
// table, where another copy of them in the same process could be bound in their place.
// tests/abi/check_exports.sh checks both halves: the export list and the headers' markers.
#pragma once

#define NVIO_API_BEGIN _Pragma("GCC visibility push(default)")
#define NVIO_API_END _Pragma("GCC visibility pop")
// On a declaration in a public header that is not part of the API (a private member's internal
// type, an implementation struct): kept out of the export list all the same.
#define NVIO_LOCAL __attribute__((visibility("hidden")))
