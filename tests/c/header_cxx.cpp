// C++ compatibility check of include/vrange.h: the header must compile as C++11 and later,
// declare every function with C linkage (this file links against libvrange.so by the
// unmangled names) and with exactly the signatures below, and lay out its structs as the
// library writes them. Nothing is called.
//
//     g++ -std=c++11 -Wall -Wextra -Werror -pedantic tests/c/header_cxx.cpp
//         $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs vrange) -o header_cxx

#include <vrange.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

static_assert(VRANGE_VOLATILE == 0 && VRANGE_NOVOLATILE == 1, "mode values");
static_assert(VRANGE_FEATURE_MADV_FREE == 1 && VRANGE_FEATURE_MEMCG == (UINT64_C(1) << 10),
              "feature bits");
static_assert(std::is_same<decltype(VRANGE_FEATURE_PSI), std::uint64_t>::value ||
                  std::is_same<decltype(VRANGE_FEATURE_PSI), unsigned long long>::value ||
                  std::is_same<decltype(VRANGE_FEATURE_PSI), unsigned long>::value,
              "feature bits are 64-bit unsigned");

// vrange_alloc flags: policies in bits 0-1, the other groups in bits of their own.
static_assert(VRANGE_HYBRID == 0 && VRANGE_LAZY == 1 && VRANGE_MANAGED == 2, "policies");
static_assert(VRANGE_SHARED == 4 && VRANGE_DROP_NORMAL == 0, "shared, normal class");
static_assert(VRANGE_DROP_FIRST == 0x10 && VRANGE_DROP_LOW == 0x20 && VRANGE_DROP_LAST == 0x40,
              "classes");
static_assert(VRANGE_NOHUGE == 0x100 && VRANGE_HUGE == 0x200, "huge pages");
static_assert(VRANGE_VERSION == VRANGE_VERSION_MAJOR * 10000 + VRANGE_VERSION_MINOR * 100 +
                                     VRANGE_VERSION_PATCH,
              "version number");
static_assert(VRANGE_SOURCE_PSI == 0 && VRANGE_SOURCE_EXPLICIT == 6 && VRANGE_SOURCE_COUNT == 7,
              "sources");

// The layout libvrange writes: 64-bit counters, no padding.
static_assert(sizeof(struct vrange_source_stats) == 7 * 8, "vrange_source_stats size");
static_assert(sizeof(struct vrange_stats) == (14 + 7 * 7 + 8) * 8, "vrange_stats size");
static_assert(offsetof(struct vrange_stats, scratch_regions) == (14 + 7 * 7) * 8, "version 2 appended");
static_assert(offsetof(struct vrange_stats, refill_recycled_bytes) == (14 + 7 * 7 + 5) * 8,
              "version 3 appended");
static_assert(offsetof(struct vrange_stats, reserve_bytes) == (14 + 7 * 7 + 6) * 8,
               "version 4 appended");
static_assert(offsetof(struct vrange_stats, refill_moved_bytes) == (14 + 7 * 7 + 7) * 8,
              "version 4 appended");
static_assert(offsetof(struct vrange_cache_stats, promoted) == (10 + 4 * 8 + 2) * 8,
              "cache stats: promoted appended");
static_assert(offsetof(struct vrange_stats, size) == 0, "size first");
static_assert(offsetof(struct vrange_stats, reclaimer_sources) == 13 * 8, "gauges and totals");
static_assert(offsetof(struct vrange_stats, sources) == 14 * 8, "sources last");
static_assert(offsetof(struct vrange_source_stats, purging_events) == 6 * 8, "source counters");
static_assert(std::is_standard_layout<struct vrange_stats>::value, "C layout");

int main()
{
    ssize_t (*mark)(unsigned long, size_t, int, int *) = &vrange;
    ssize_t (*unmark)(void *, size_t, size_t *) = &vrange_unmark;
    ssize_t (*features)(char *, size_t) = &vrange_features;
    int (*forget)(void *, size_t) = &vrange_forget;
    std::uint64_t (*flags)() = &vrange_feature_flags;
    void *(*alloc)(size_t, int) = &vrange_alloc;
    int (*free_)(void *, size_t) = &vrange_free;
    int (*set_priority)(void *, size_t, int) = &vrange_set_priority;
    int (*shared_fd)(void *) = &vrange_shared_fd;
    void *(*map_shared)(int, int, size_t *) = &vrange_map_shared;
    size_t (*purge)(size_t) = &vrange_purge;
    int (*stats)(struct vrange_stats *, size_t) = &vrange_stats;
    const char *(*source_name)(int) = &vrange_source_name;
    int (*set_option)(const char *, const char *) = &vrange_set_option;
    void (*reclaimer_stop)() = &vrange_reclaimer_stop;
    unsigned (*version)() = &vrange_version;
    // Volatile reads keep the compiler from folding the checks away.
    void *volatile addrs[] = {
        reinterpret_cast<void *>(mark),         reinterpret_cast<void *>(unmark),
        reinterpret_cast<void *>(features),     reinterpret_cast<void *>(forget),
        reinterpret_cast<void *>(flags),        reinterpret_cast<void *>(alloc),
        reinterpret_cast<void *>(free_),        reinterpret_cast<void *>(set_priority),
        reinterpret_cast<void *>(shared_fd),    reinterpret_cast<void *>(map_shared),
        reinterpret_cast<void *>(purge),        reinterpret_cast<void *>(stats),
        reinterpret_cast<void *>(source_name),  reinterpret_cast<void *>(set_option),
        reinterpret_cast<void *>(reclaimer_stop), reinterpret_cast<void *>(version)};
    for (void *volatile const &a : addrs) {
        if (a == nullptr)
            return 1;
    }
    return 0;
}
