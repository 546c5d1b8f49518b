// C++ compatibility check of include/vrange.h: the header must compile as C++11 and later,
// declare every function with C linkage (this file links against libvrange.so by the
// unmangled names) and with exactly the signatures below. Nothing is called.
//
//     g++ -std=c++11 -Wall -Wextra -Werror -pedantic tests/c/header_cxx.cpp
//         $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs vrange) -o header_cxx

#include <vrange.h>

#include <cstdint>
#include <type_traits>

static_assert(VRANGE_VOLATILE == 0 && VRANGE_NOVOLATILE == 1, "mode values");
static_assert(VRANGE_FEATURE_MADV_FREE == 1 && VRANGE_FEATURE_MEMCG == (UINT64_C(1) << 10),
              "feature bits");
static_assert(std::is_same<decltype(VRANGE_FEATURE_PSI), std::uint64_t>::value ||
                  std::is_same<decltype(VRANGE_FEATURE_PSI), unsigned long long>::value ||
                  std::is_same<decltype(VRANGE_FEATURE_PSI), unsigned long>::value,
              "feature bits are 64-bit unsigned");

int main()
{
    ssize_t (*mark)(unsigned long, size_t, int, int *) = &vrange;
    ssize_t (*unmark)(void *, size_t, size_t *) = &vrange_unmark;
    ssize_t (*features)(char *, size_t) = &vrange_features;
    int (*forget)(void *, size_t) = &vrange_forget;
    std::uint64_t (*flags)() = &vrange_feature_flags;
    // Volatile reads keep the compiler from folding the checks away.
    void *volatile addrs[] = {reinterpret_cast<void *>(mark), reinterpret_cast<void *>(unmark),
                              reinterpret_cast<void *>(features), reinterpret_cast<void *>(forget),
                              reinterpret_cast<void *>(flags)};
    for (void *volatile const &a : addrs) {
        if (a == nullptr)
            return 1;
    }
    return 0;
}
